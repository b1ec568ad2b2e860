import { createServer, type IncomingMessage, type ServerResponse } from "node:http";

/**
 * An HTTP forwarder to a model server that holds every decision call until `open()`: a test makes "every admission
 * is decided before any model call answers" an order it controls, instead of a model delay a busy machine may outlast.
 * Everything else (the model list, health checks) goes through at once.
 */
export interface ModelGate {
  url: string;
  /** Decision calls waiting for the gate. */
  held(): number;
  /** Lets the held calls and every later one through. */
  open(): void;
  /** Told whenever a call is held. */
  onHold(listener: () => void): void;
  close(): Promise<void>;
}

export async function startModelGate(target: string): Promise<ModelGate> {
  let opened = false;
  const waiting: Array<() => void> = [];
  const listeners: Array<() => void> = [];
  const forward = async (req: IncomingMessage, body: Buffer, res: ServerResponse) => {
    try {
      const headers: Record<string, string> = {};
      for (const name of ["authorization", "content-type", "x-fake-behavior"]) {
        const value = req.headers[name];
        if (typeof value === "string") headers[name] = value;
      }
      const upstream = await fetch(`${target}${req.url ?? "/"}`, {
        method: req.method ?? "GET",
        headers,
        ...(body.length > 0 ? { body } : {}),
      });
      const answer = Buffer.from(await upstream.arrayBuffer());
      res.writeHead(upstream.status, { "content-type": upstream.headers.get("content-type") ?? "application/json" });
      res.end(answer);
    } catch {
      res.destroy();
    }
  };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const go = () => void forward(req, body, res);
      if (opened || req.method !== "POST" || !req.url?.startsWith("/v1/systemone")) return go();
      waiting.push(go);
      for (const l of listeners) l();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    held: () => (opened ? 0 : waiting.length),
    open() {
      opened = true;
      for (const go of waiting.splice(0)) go();
    },
    onHold: (listener) => listeners.push(listener),
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
