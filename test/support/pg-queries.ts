import pg from "pg";

/** One query a pg client of this process sent: the client, what it was given, and the promise of its answer. */
export interface SentQuery {
  client: pg.Client;
  config: unknown;
  answer: Promise<unknown>;
}

/** Runs `fn`, telling `onQuery` of every query any pg client of this process sends meanwhile (sent as it was). */
export async function watchQueries<T>(onQuery: (sent: SentQuery) => void, fn: () => Promise<T>): Promise<T> {
  const query = pg.Client.prototype.query;
  pg.Client.prototype.query = function (this: pg.Client, config: unknown, ...rest: unknown[]) {
    const answer = (query as (...a: unknown[]) => Promise<unknown>).call(this, config, ...rest);
    onQuery({ client: this, config, answer });
    return answer;
  } as typeof query;
  try {
    return await fn();
  } finally {
    pg.Client.prototype.query = query;
  }
}
