import { createServer, type IncomingHttpHeaders } from "node:http";
import { type AddressInfo, createServer as createTcpServer, type Socket } from "node:net";

/** A span as it arrived, either protocol: ids in hex, kind as OTLP numbers it (1 internal, 2 server, 3 client). */
export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** "" for a root span. */
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Record<string, string | number | boolean>;
  /** 0 unset, 1 ok, 2 error. */
  statusCode: number;
  resource: Record<string, string | number | boolean>;
}

export interface OtlpReceiver {
  /** Its origin: what OTEL_EXPORTER_OTLP_ENDPOINT names. */
  url: string;
  spans: ReceivedSpan[];
  /** The content types of the exports received (application/json, application/x-protobuf). */
  contentTypes: string[];
  /** The request headers of the exports received. */
  headers: IncomingHttpHeaders[];
  /** Resolves once a span matches (rejects after `timeoutMs`: an export that never comes). */
  waitFor(match: (span: ReceivedSpan) => boolean, timeoutMs?: number): Promise<ReceivedSpan>;
  close(): Promise<void>;
}

/** A local OTLP/HTTP trace receiver (POST /v1/traces, http/json and http/protobuf), like a Collector's otlp receiver. */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const contentTypes: string[] = [];
  const headers: IncomingHttpHeaders[] = [];
  const waiters = new Set<() => void>();
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.method !== "POST" || req.url !== "/v1/traces") {
        res.writeHead(404).end();
        return;
      }
      const type = (req.headers["content-type"] ?? "").split(";")[0]!.trim();
      const body = Buffer.concat(chunks);
      contentTypes.push(type);
      headers.push(req.headers);
      if (type === "application/json") {
        spans.push(...fromJson(JSON.parse(body.toString("utf8"))));
        res.writeHead(200, { "content-type": "application/json" }).end("{}");
      } else if (type === "application/x-protobuf") {
        spans.push(...fromProtobuf(body));
        res.writeHead(200, { "content-type": "application/x-protobuf" }).end();
      } else {
        res.writeHead(415).end();
        return;
      }
      for (const wake of waiters) wake();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    contentTypes,
    headers,
    waitFor(match, timeoutMs = 20_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const found = spans.find(match);
          if (!found) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(found);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`no matching span arrived within ${timeoutMs} ms; got: ${spans.map((s) => s.name).join(", ")}`));
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A collector that hangs: it accepts connections and never answers. `url` is what OTEL_EXPORTER_OTLP_ENDPOINT names. */
export async function startSilentCollector(): Promise<{ url: string; connections: () => number; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let accepted = 0;
  const server = createTcpServer((socket) => {
    accepted++;
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    connections: () => accepted,
    close: () =>
      new Promise((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** An origin where no collector listens: a port that was free a moment ago. */
export async function closedPortUrl(): Promise<string> {
  const server = createTcpServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

type Json = { [key: string]: any };

function jsonValue(v: Json): string | number | boolean {
  if ("stringValue" in v) return v.stringValue;
  if ("boolValue" in v) return v.boolValue;
  if ("intValue" in v) return Number(v.intValue);
  if ("doubleValue" in v) return Number(v.doubleValue);
  return JSON.stringify(v);
}

const jsonAttributes = (list: Json[] | undefined) => Object.fromEntries((list ?? []).map((kv) => [kv.key, jsonValue(kv.value ?? {})]));

function fromJson(body: Json): ReceivedSpan[] {
  return (body.resourceSpans ?? []).flatMap((rs: Json) => {
    const resource = jsonAttributes(rs.resource?.attributes);
    return (rs.scopeSpans ?? []).flatMap((ss: Json) =>
      (ss.spans ?? []).map((s: Json) => ({
        traceId: s.traceId,
        spanId: s.spanId,
        parentSpanId: s.parentSpanId ?? "",
        name: s.name,
        kind: s.kind,
        attributes: jsonAttributes(s.attributes),
        statusCode: s.status?.code ?? 0,
        resource,
      })),
    );
  });
}

// The protobuf wire format, as far as ExportTraceServiceRequest needs it.

interface Field {
  number: number;
  varint?: bigint;
  bytes?: Buffer;
  fixed?: Buffer;
}

function readVarint(buf: Buffer, at: { pos: number }): bigint {
  let result = 0n;
  let shift = 0n;
  for (;;) {
    const byte = buf[at.pos++]!;
    result |= BigInt(byte & 0x7f) << shift;
    if ((byte & 0x80) === 0) return result;
    shift += 7n;
  }
}

function fields(buf: Buffer): Field[] {
  const out: Field[] = [];
  const at = { pos: 0 };
  while (at.pos < buf.length) {
    const tag = Number(readVarint(buf, at));
    const number = tag >>> 3;
    switch (tag & 7) {
      case 0:
        out.push({ number, varint: readVarint(buf, at) });
        break;
      case 1:
        out.push({ number, fixed: buf.subarray(at.pos, at.pos + 8) });
        at.pos += 8;
        break;
      case 2: {
        const length = Number(readVarint(buf, at));
        out.push({ number, bytes: buf.subarray(at.pos, at.pos + length) });
        at.pos += length;
        break;
      }
      case 5:
        out.push({ number, fixed: buf.subarray(at.pos, at.pos + 4) });
        at.pos += 4;
        break;
      default:
        throw new Error(`unsupported protobuf wire type ${tag & 7}`);
    }
  }
  return out;
}

const all = (buf: Buffer, number: number) => fields(buf).filter((f) => f.number === number);
const one = (buf: Buffer, number: number) => fields(buf).find((f) => f.number === number);

function anyValue(buf: Buffer): string | number | boolean {
  const f = fields(buf)[0];
  if (!f) return "";
  if (f.number === 1) return f.bytes!.toString("utf8");
  if (f.number === 2) return f.varint !== 0n;
  if (f.number === 3) return Number(BigInt.asIntN(64, f.varint!));
  if (f.number === 4) return f.fixed!.readDoubleLE(0);
  return `(field ${f.number})`;
}

function protoAttributes(list: Field[]): Record<string, string | number | boolean> {
  return Object.fromEntries(
    list.map((kv) => {
      const key = one(kv.bytes!, 1)?.bytes?.toString("utf8") ?? "";
      const value = one(kv.bytes!, 2)?.bytes;
      return [key, value ? anyValue(value) : ""];
    }),
  );
}

function fromProtobuf(body: Buffer): ReceivedSpan[] {
  return all(body, 1).flatMap((rs) => {
    const resourceBytes = one(rs.bytes!, 1)?.bytes;
    const resource = resourceBytes ? protoAttributes(all(resourceBytes, 1)) : {};
    return all(rs.bytes!, 2).flatMap((ss) =>
      all(ss.bytes!, 2).map((s) => {
        const span = s.bytes!;
        const status = one(span, 15)?.bytes;
        return {
          traceId: one(span, 1)?.bytes?.toString("hex") ?? "",
          spanId: one(span, 2)?.bytes?.toString("hex") ?? "",
          parentSpanId: one(span, 4)?.bytes?.toString("hex") ?? "",
          name: one(span, 5)?.bytes?.toString("utf8") ?? "",
          kind: Number(one(span, 6)?.varint ?? 0n),
          attributes: protoAttributes(all(span, 9)),
          statusCode: status ? Number(one(status, 3)?.varint ?? 0n) : 0,
          resource,
        };
      }),
    );
  });
}
