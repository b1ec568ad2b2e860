/**
 * One description per table, from which both dialects build their SQL: column lists, placeholders, SET lists,
 * PostgreSQL's `unnest` casts, and the mapping between a database row and the object a field list names.
 * A description names each column once: its SQL name and its type; the TypeScript field is the key.
 */

/** A column's type; a boolean is stored as 0/1 in SQLite and as a boolean in PostgreSQL. Null is null in both. */
export type ColumnType = "text" | "bigint" | "int" | "float" | "boolean";

export interface Column {
  readonly name: string;
  readonly type: ColumnType;
}

const POSTGRES_TYPES: Record<ColumnType, string> = { text: "text", bigint: "bigint", int: "int", float: "float8", boolean: "bool" };

export const text = (name: string): Column => ({ name, type: "text" });
export const bigint = (name: string): Column => ({ name, type: "bigint" });
export const int = (name: string): Column => ({ name, type: "int" });
export const float = (name: string): Column => ({ name, type: "float" });
export const boolean = (name: string): Column => ({ name, type: "boolean" });

/** A database row: values by column name. */
export type DbRow = Record<string, unknown>;

export class Table<T> {
  /** Every field, in the order of the description. */
  readonly fields: readonly (keyof T & string)[];

  constructor(
    readonly name: string,
    readonly columns: { readonly [K in keyof T]-?: Column },
  ) {
    this.fields = Object.keys(columns) as (keyof T & string)[];
  }

  /** The fields but `omit`, in order. */
  fieldsExcept<K extends keyof T & string>(...omit: K[]): Exclude<keyof T & string, K>[] {
    return this.fields.filter((f): f is Exclude<keyof T & string, K> => !omit.includes(f as K));
  }

  /** The column names of the fields, each with `prefix` (an alias and a dot) when given. */
  names(fields: readonly (keyof T)[] = this.fields, prefix = ""): string[] {
    return fields.map((f) => prefix + this.columns[f].name);
  }

  /** `a, b, c`: the column list of the fields. */
  list(fields: readonly (keyof T)[] = this.fields, prefix = ""): string {
    return this.names(fields, prefix).join(", ");
  }

  /** `a = <value(a)>, b = <value(b)>`: a SET list, e.g. `(c) => \`excluded.${c}\``. */
  assign(fields: readonly (keyof T)[], value: (column: string) => string): string {
    return this.names(fields)
      .map((c) => `${c} = ${value(c)}`)
      .join(", ");
  }

  /** ` ON CONFLICT (key) DO UPDATE SET …`: an upsert that replaces every other column with the row inserted. */
  onConflictReplace(key: readonly (keyof T)[]): string {
    const others = this.fields.filter((f) => !key.includes(f));
    return ` ON CONFLICT (${this.list(key)}) DO UPDATE SET ${this.assign(others, (c) => `excluded.${c}`)}`;
  }

  /** The object of the fields from a database row (or JSON of one): booleans decoded (SQLite 0/1), null kept. */
  fromRow<K extends keyof T & string>(row: object, fields: readonly K[] = this.fields as K[]): Pick<T, K> {
    const out = {} as Pick<T, K>;
    for (const f of fields) {
      const { name, type } = this.columns[f];
      const value = (row as DbRow)[name];
      out[f] = (type === "boolean" && value !== null ? value === true || value === 1 : value) as T[K];
    }
    return out;
  }

  /** The values of the fields of `item`, as parameters of `dialect` (undefined is null). */
  params(dialect: Dialect, item: Partial<T>, fields: readonly (keyof T)[] = this.fields): unknown[] {
    return fields.map((f) => dialect.encode(this.columns[f].type, item[f]));
  }
}

export interface Dialect {
  readonly name: "sqlite" | "postgres";
  encode(type: ColumnType, value: unknown): unknown;
}

export const sqlite = {
  name: "sqlite",
  encode: (type: ColumnType, value: unknown) =>
    value === undefined || value === null ? null : type === "boolean" ? (value ? 1 : 0) : value,

  /** `?, ?, ?`. */
  placeholders: (count: number): string => Array(count).fill("?").join(", "),

  /** `INSERT INTO t (a, b) VALUES (?, ?)`, parameters from `table.params(sqlite, …)`. */
  insert<T>(table: Table<T>, fields: readonly (keyof T)[] = table.fields): string {
    return `INSERT INTO ${table.name} (${table.list(fields)}) VALUES (${sqlite.placeholders(fields.length)})`;
  },
} as const satisfies Dialect & Record<string, unknown>;

/** Statements numbered so far: the texts are the program's own, a fixed set. */
const numberedTexts = new Map<string, string>();

export const postgres = {
  name: "postgres",
  encode: (_type: ColumnType, value: unknown) => value ?? null,

  /** `$1, $2, $3`. */
  placeholders: (count: number, first = 1): string => Array.from({ length: count }, (_, i) => `$${first + i}`).join(", "),

  /** A statement written with `?` placeholders (none inside its literals), numbered `$1…$n`. */
  numbered(sql: string): string {
    let done = numberedTexts.get(sql);
    if (done === undefined) {
      let n = 0;
      done = sql.replace(/\?/g, () => `$${++n}`);
      numberedTexts.set(sql, done);
    }
    return done;
  },

  /** `unnest($1::text[], $2::bigint[])`: one array parameter per field, from `arrays`. */
  unnest<T>(table: Table<T>, fields: readonly (keyof T)[] = table.fields): string {
    const casts = fields.map((f, i) => `$${i + 1}::${POSTGRES_TYPES[table.columns[f].type]}[]`);
    return `unnest(${casts.join(", ")})`;
  },

  /** `unnest(…) AS alias(a, b)`: the arrays as a relation whose columns are named like the table's. */
  unnestAs<T>(table: Table<T>, fields: readonly (keyof T)[], alias: string): string {
    return `${postgres.unnest(table, fields)} AS ${alias}(${table.list(fields)})`;
  },

  /** `INSERT INTO t [AS alias] (a, b) SELECT * FROM unnest(…)`, parameters from `arrays`. */
  insert<T>(table: Table<T>, fields: readonly (keyof T)[] = table.fields, alias?: string): string {
    const into = alias === undefined ? table.name : `${table.name} AS ${alias}`;
    return `INSERT INTO ${into} (${table.list(fields)}) SELECT * FROM ${postgres.unnest(table, fields)}`;
  },

  /** The parameters of `unnest`: one array per field, of the items' values. */
  arrays<T>(table: Table<T>, items: readonly Partial<T>[], fields: readonly (keyof T)[] = table.fields): unknown[][] {
    return fields.map((f) => items.map((item) => postgres.encode(table.columns[f].type, item[f])));
  },
} as const satisfies Dialect & Record<string, unknown>;
