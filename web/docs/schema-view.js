// Renders JSON Schemas (as found in an OpenAPI 3.1 document) as nested lists of fields: name, type,
// required marker, constraints, description, and the fields of objects, array items, map values and
// oneOf/anyOf variants. Local $refs ("#/components/schemas/…") are followed, cycles cut.

import { h } from "../console/dom.js";

const MAX_DEPTH = 14;

/** The node a local JSON pointer ("#/a/b") leads to in `doc`, or undefined. */
function resolvePointer(doc, ref) {
  if (typeof ref !== "string" || !ref.startsWith("#")) return undefined;
  let node = doc;
  for (const raw of ref.slice(1).split("/").slice(1)) {
    const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    if (node === null || typeof node !== "object" || !Object.hasOwn(node, key)) return undefined;
    node = node[key];
  }
  return node;
}

/** Text with `backtick` spans shown as code (descriptions in the document use them). */
export function richText(text) {
  return String(text)
    .split(/`([^`]+)`/)
    .map((part, i) => (i % 2 === 1 ? h("code", { text: part }) : part));
}

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

/**
 * Follows $ref chains. Returns the schema (with the referring schema's own description kept), the last ref's name,
 * whether a ref already open higher up was met (a cycle), and the context with the refs now open.
 */
function deref(schema, ctx) {
  let current = schema;
  let refName = null;
  const description = schema.description;
  while (isObject(current) && typeof current.$ref === "string") {
    const ref = current.$ref;
    if (ctx.open.has(ref)) return { schema: {}, refName: ref.split("/").pop(), cycle: true };
    const target = resolvePointer(ctx.doc, ref);
    refName = ref.split("/").pop();
    if (!isObject(target)) return { schema: { description: `Unresolved reference ${ref}` }, refName, cycle: false };
    ctx = { ...ctx, open: new Set([...ctx.open, ref]) };
    current = target;
  }
  return { schema: description && current.description !== description ? { ...current, description } : current, refName, cycle: false, ctx };
}

/** The values a schema allows when they are a fixed set: enum, const, or anyOf/oneOf of those. */
function allowedValues(schema) {
  if (Array.isArray(schema.enum)) return schema.enum;
  if ("const" in schema) return [schema.const];
  const variants = schema.anyOf ?? schema.oneOf;
  if (Array.isArray(variants) && variants.length > 0 && variants.every((v) => isObject(v) && ("const" in v || Array.isArray(v.enum)))) {
    return variants.flatMap((v) => v.enum ?? [v.const]);
  }
  return null;
}

/** anyOf/oneOf of one schema and {type: "null"}: that schema, marked nullable (the outer description wins). */
function unwrapNullable(schema) {
  const key = Array.isArray(schema.anyOf) ? "anyOf" : Array.isArray(schema.oneOf) ? "oneOf" : null;
  if (!key) return null;
  const variants = schema[key];
  const others = variants.filter((v) => !(isObject(v) && v.type === "null" && Object.keys(v).length === 1));
  if (others.length !== 1 || variants.length !== 2 || !isObject(others[0])) return null;
  const { [key]: _variants, ...outer } = schema;
  return { ...others[0], ...outer, description: outer.description ?? others[0].description };
}

/** A variant with nothing but a type (and perhaps a title): shown as part of a "string | number" label. */
const isBareType = (v) => isObject(v) && typeof v.type === "string" && Object.keys(v).every((k) => k === "type" || k === "title");

function baseType(schema, values) {
  if (Array.isArray(schema.type)) return schema.type.join(" | ");
  if (typeof schema.type === "string") return schema.type;
  if (values) return [...new Set(values.map((v) => (v === null ? "null" : typeof v)))].join(" | ");
  if (schema.properties || schema.additionalProperties || schema.patternProperties) return "object";
  if (schema.items) return "array";
  const variants = schema.anyOf ?? schema.oneOf;
  if (Array.isArray(variants) && variants.every(isBareType)) return variants.map((v) => v.type).join(" | ");
  if (variants || schema.allOf) return "";
  return "any";
}

const json = (value) => JSON.stringify(value);

function range(min, max, unit, units) {
  const u = (n) => (n === 1 ? unit : units);
  if (min !== undefined && max !== undefined) return min === max ? `exactly ${min} ${u(min)}` : `${min}–${max} ${units}`;
  if (min !== undefined) return `at least ${min} ${u(min)}`;
  if (max !== undefined) return `at most ${max} ${u(max)}`;
  return null;
}

/** Constraints as short phrases; values are shown as code. */
function constraints(schema, values, ctx) {
  const facts = [];
  const code = (text) => h("code", { text });
  if (values && values.length === 1) facts.push(["value ", code(json(values[0]))]);
  else if (values) facts.push(["one of ", values.flatMap((v, i) => [i ? ", " : "", code(json(v))])]);
  if (schema.format) facts.push([`format ${schema.format}`]);
  if (schema.minimum !== undefined) facts.push([`≥ ${schema.minimum}`]);
  if (schema.exclusiveMinimum !== undefined) facts.push([`> ${schema.exclusiveMinimum}`]);
  if (schema.maximum !== undefined) facts.push([`≤ ${schema.maximum}`]);
  if (schema.exclusiveMaximum !== undefined) facts.push([`< ${schema.exclusiveMaximum}`]);
  if (schema.multipleOf !== undefined) facts.push([`multiple of ${schema.multipleOf}`]);
  const lengths = range(schema.minLength, schema.maxLength, "character", "characters");
  if (lengths) facts.push([lengths]);
  if (schema.pattern) facts.push(["pattern ", code(schema.pattern)]);
  const items = range(schema.minItems, schema.maxItems, "item", "items");
  if (items) facts.push([items]);
  if (schema.uniqueItems) facts.push(["unique items"]);
  const entries = range(schema.minProperties, schema.maxProperties, "entry", "entries");
  if (entries) facts.push([entries]);
  if (isObject(schema.propertyNames)) {
    const p = schema.propertyNames;
    const keys = range(p.minLength, p.maxLength, "character", "characters");
    if (keys) facts.push([`keys of ${keys}`]);
    if (p.pattern) facts.push(["keys match ", code(p.pattern)]);
  }
  if (schema.default !== undefined) facts.push(["default ", code(json(schema.default))]);
  if (schema.additionalProperties === false && ctx.inRequest) facts.push(["no other properties"]);
  if (schema.readOnly) facts.push(["read-only"]);
  if (schema.writeOnly) facts.push(["write-only"]);
  if (schema.deprecated) facts.push(["deprecated"]);
  return facts;
}

function examplesOf(schema) {
  if (schema.example !== undefined) return [schema.example];
  return Array.isArray(schema.examples) ? schema.examples : [];
}

/** The pieces of one schema: its type label, title, constraints, description, examples and child rows. */
function describe(input, ctx) {
  const resolved = deref(isObject(input) ? input : {}, ctx);
  if (resolved.cycle)
    return { type: resolved.refName, title: null, facts: [["recursive: see above"]], description: null, examples: [], children: [] };
  ctx = resolved.ctx ?? ctx;
  let schema = resolved.schema;
  const nullable = unwrapNullable(schema);
  if (nullable) schema = nullable;
  const values = allowedValues(schema);
  let type = baseType(schema, values);
  const children = ctx.depth >= MAX_DEPTH ? [] : childRows(schema, values, ctx);

  if (type === "array" && isObject(schema.items)) {
    const item = deref(schema.items, ctx);
    const itemType = item.cycle ? item.refName : baseType(unwrapNullable(item.schema) ?? item.schema, allowedValues(item.schema));
    type = `array of ${item.schema.title ?? item.refName ?? (itemType || "items")}`;
  }
  if (nullable) type = `${type || "value"} or null`;
  return {
    type,
    title: schema.title ?? resolved.refName,
    facts: constraints(schema, values, ctx),
    description: schema.description ?? null,
    examples: examplesOf(schema),
    children,
  };
}

function childRows(schema, values, ctx) {
  const deeper = { ...ctx, depth: ctx.depth + 1 };
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const rows = [];
  for (const [name, prop] of Object.entries(isObject(schema.properties) ? schema.properties : {})) {
    rows.push(fieldRow({ name }, prop, required.has(name), deeper));
  }
  for (const [pattern, prop] of Object.entries(isObject(schema.patternProperties) ? schema.patternProperties : {})) {
    rows.push(fieldRow({ placeholder: "{key}", note: ["keys match ", h("code", { text: pattern })] }, prop, false, deeper));
  }
  if (isObject(schema.additionalProperties))
    rows.push(fieldRow({ placeholder: "{key}", note: ["any other key"] }, schema.additionalProperties, false, deeper));
  if (isObject(schema.items) && hasDetail(schema.items, deeper))
    rows.push(fieldRow({ placeholder: "[item]", note: ["each item"] }, schema.items, false, deeper));

  const variants = values ? null : (schema.oneOf ?? schema.anyOf);
  if (Array.isArray(variants) && !variants.every(isBareType)) {
    const exclusive = Boolean(schema.oneOf);
    const discriminator = schema.discriminator?.propertyName;
    const heading = [
      exclusive ? "Exactly one of" : "Any of",
      discriminator ? [", chosen by ", h("code", { text: discriminator })] : "",
      ":",
    ];
    rows.push(variantGroup(heading, variants, deeper));
  }
  if (Array.isArray(schema.allOf)) rows.push(variantGroup(["All of:"], schema.allOf, deeper));
  if (isObject(schema.not)) rows.push(fieldRow({ placeholder: "not", note: ["must not match"] }, schema.not, false, deeper));
  return rows;
}

/** Whether an array's item schema has more to show than its type (which the array's label already names). */
function hasDetail(items, ctx) {
  const { schema } = deref(items, ctx);
  const inner = unwrapNullable(schema) ?? schema;
  const structured =
    inner.properties || inner.patternProperties || isObject(inner.additionalProperties) || inner.oneOf || inner.anyOf || inner.allOf;
  return Boolean(structured || inner.description) || constraints(inner, allowedValues(inner), ctx).length > 0;
}

function variantGroup(heading, variants, ctx) {
  return h(
    "li",
    { class: "variants" },
    h("p", { class: "variants-title" }, heading),
    h(
      "ol",
      { class: "schema-fields" },
      variants.map((v, i) => fieldRow({ placeholder: `option ${i + 1}`, titled: true }, v, false, ctx)),
    ),
  );
}

/** One field: name (or a placeholder such as {key}), type, required marker, constraints, description, and its own fields. */
function fieldRow(name, schema, required, ctx) {
  const d = describe(schema, ctx);
  const titleAsName = name.titled && d.title;
  const label =
    name.name !== undefined
      ? h("code", { class: "field-name", text: name.name })
      : h("span", { class: ["field-name", !titleAsName && "field-placeholder"], text: titleAsName ? d.title : name.placeholder });
  return h(
    "li",
    { class: "field" },
    h(
      "div",
      { class: "field-head" },
      label,
      d.type ? h("span", { class: "field-type", text: d.type }) : null,
      d.title && !titleAsName && !d.type.includes(d.title) ? h("span", { class: "field-title", text: d.title }) : null,
      required ? h("span", { class: "field-required", text: "required" }) : null,
    ),
    factsList([...(name.note ? [name.note] : []), ...d.facts]),
    d.description ? h("p", { class: "field-description" }, richText(d.description)) : null,
    examplesBlock(d.examples),
    d.children.length > 0 ? h("ul", { class: "schema-fields" }, d.children) : null,
  );
}

function factsList(facts) {
  return facts.length > 0
    ? h(
        "ul",
        { class: "field-facts" },
        facts.map((f) => h("li", null, f)),
      )
    : null;
}

function examplesBlock(examples) {
  if (examples.length === 0) return null;
  return examples.map((e) =>
    h("pre", { class: "code schema-example", tabindex: "0", "aria-label": "Example" }, JSON.stringify(e, null, 2)),
  );
}

/**
 * A whole schema (a request body, a response, a parameter's schema): its type line, constraints and
 * description, then its fields. `inRequest` adds "no other properties" where unknown fields are refused.
 */
export function schemaView(schema, doc, { inRequest = false } = {}) {
  const d = describe(schema, { doc, open: new Set(), depth: 0, inRequest });
  return h(
    "div",
    { class: "schema" },
    h(
      "p",
      { class: "schema-type" },
      d.title ? h("span", { class: "field-title", text: d.title }) : null,
      d.type ? h("span", { class: "field-type", text: d.type }) : null,
    ),
    factsList(d.facts),
    d.description ? h("p", { class: "field-description" }, richText(d.description)) : null,
    examplesBlock(d.examples),
    d.children.length > 0 ? h("ul", { class: "schema-fields schema-root" }, d.children) : null,
  );
}

/** A parameter's schema in one line: its type label, constraints and description, without child rows. */
export function schemaSummary(schema, doc) {
  const d = describe(schema, { doc, open: new Set(), depth: MAX_DEPTH, inRequest: true });
  return { type: d.type, facts: factsList(d.facts), description: d.description, examples: examplesBlock(d.examples) };
}
