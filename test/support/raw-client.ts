import { connect, type Socket } from "node:net";

export interface RawAnswer {
  /** The whole answer (status line, headers, body); "" when the server closed the connection without answering. */
  answer: string;
  /** The status of the answer; null when there was none. */
  status: number | null;
}

export interface RawConnection {
  socket: Socket;
  /** Writes `request` and resolves with the next whole answer (Content-Length framed), or none when the connection closes first. */
  send(request: string): Promise<RawAnswer>;
  /** Resolves once the connection is closed (by either side). */
  closed: Promise<void>;
  isClosed(): boolean;
}

/**
 * A client connection from `localAddress` (any of 127.0.0.0/8 on Linux, so that tests can be several clients) that
 * stays open between requests. A safety net closes it after `giveUpMs`.
 */
export function rawConnection(url: string, localAddress = "127.0.0.1", giveUpMs = 15_000): RawConnection {
  const socket = connect({ port: Number(new URL(url).port), host: "127.0.0.1", localAddress });
  let data = Buffer.alloc(0);
  let closed = false;
  let waiting: ((answer: RawAnswer) => void) | null = null;
  const settle = (answer: string) => {
    const status = /^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1];
    const resolve = waiting;
    waiting = null;
    resolve?.({ answer, status: status ? Number(status) : null });
  };
  const closedPromise = new Promise<void>((resolveClosed) =>
    socket.on("close", () => {
      closed = true;
      settle(data.toString("latin1"));
      data = Buffer.alloc(0);
      resolveClosed();
    }),
  );
  socket.on("data", (chunk: Buffer) => {
    data = Buffer.concat([data, chunk]);
    const end = data.indexOf("\r\n\r\n");
    if (end < 0 || !waiting) return;
    const head = data.subarray(0, end).toString("latin1");
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
    if (data.length < end + 4 + length) return;
    const answer = data.subarray(0, end + 4 + length).toString("latin1");
    data = data.subarray(end + 4 + length);
    settle(answer);
  });
  socket.on("error", () => undefined);
  setTimeout(() => socket.destroy(), giveUpMs).unref();
  return {
    socket,
    send: (request) =>
      new Promise<RawAnswer>((resolve) => {
        if (closed) return resolve({ answer: "", status: null });
        waiting = resolve;
        socket.write(request);
      }),
    closed: closedPromise,
    isClosed: () => closed,
  };
}

/** One request on a new connection from `localAddress`, left open afterwards. */
export async function exchange(
  url: string,
  request: string,
  localAddress = "127.0.0.1",
  giveUpMs = 15_000,
): Promise<RawConnection & RawAnswer> {
  const connection = rawConnection(url, localAddress, giveUpMs);
  return { ...connection, ...(await connection.send(request)) };
}

/** The body of a raw answer. */
export function bodyOf(answer: string): string {
  return answer.slice(answer.indexOf("\r\n\r\n") + 4);
}

/** The value of one header of a raw answer (case-insensitive), or null. */
export function headerOf(answer: string, name: string): string | null {
  const head = answer.slice(0, answer.indexOf("\r\n\r\n"));
  for (const line of head.split("\r\n").slice(1)) {
    const colon = line.indexOf(":");
    if (line.slice(0, colon).trim().toLowerCase() === name.toLowerCase()) return line.slice(colon + 1).trim();
  }
  return null;
}

export const HEALTH_REQUEST = "GET /healthz HTTP/1.1\r\nHost: tds.test\r\n\r\n";

/** A raw request with a JSON body. */
export function jsonRequest(method: string, path: string, body: unknown, headers: Record<string, string> = {}): string {
  const text = JSON.stringify(body);
  const lines = Object.entries({
    host: "tds.test",
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
    ...headers,
  }).map(([k, v]) => `${k}: ${v}\r\n`);
  return `${method} ${path} HTTP/1.1\r\n${lines.join("")}\r\n${text}`;
}
