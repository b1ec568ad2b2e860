import { connect, createServer, type Server, type Socket } from "node:net";

/**
 * A TCP proxy to the gateway that loses the first response: it forwards the request, waits until
 * the gateway has answered, then closes the client's connection without passing the answer on.
 */
export async function startLossyProxy(target: URL): Promise<{ url: string; dropped: () => number; close: () => Promise<void> }> {
  let dropped = 0;
  let first = true;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    sockets.add(client);
    const upstream = connect(Number(target.port), target.hostname);
    sockets.add(upstream);
    const lose = first;
    first = false;
    client.pipe(upstream);
    upstream.on("data", (chunk) => {
      if (lose) {
        dropped++;
        client.destroy();
        upstream.destroy();
      } else client.write(chunk);
    });
    upstream.on("end", () => client.end());
    upstream.on("error", () => client.destroy());
    client.on("error", () => upstream.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    dropped: () => dropped,
    close: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
