import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";

export interface ConnectionGuardOptions {
  /** Open connections at once, at most: past it a new one closes an idle one, or is refused when none is idle. */
  maxConnections: number;
  /** Open connections from one remote address at once, at most; more are refused as they arrive. */
  maxPerAddress: number;
  /** Addresses the per-address cap does not apply to (trusted reverse proxies carry many clients). */
  exempt?: (address: string) => boolean;
  /** Idle connections are closed while more than this many are open (default: 90% of maxConnections). */
  shedAbove?: number;
  /** Told at most once per `reportEveryMs` (default 60 s) what was refused or closed since the last report. */
  onPressure?: (report: PressureReport) => void;
  reportEveryMs?: number;
  nowMs?: () => number;
}

export interface PressureReport {
  /** New connections refused because their address already had maxPerAddress open. */
  refusedPerAddress: number;
  /** New connections refused because maxConnections were open and none was idle. */
  refusedFull: number;
  /** Idle connections closed to make room. */
  shedIdle: number;
  /** The address with the most open connections now, and how many. */
  busiest: { address: string; connections: number } | null;
  open: number;
}

interface Tracked {
  socket: Socket;
  peer: Peer;
  /** Requests of this connection still being answered; 0: idle (between requests, or before the first). */
  active: number;
  counted: boolean;
}

interface Peer {
  address: string;
  open: number;
  /** Its idle connections, the longest idle first (a Set keeps insertion order). */
  idle: Set<Tracked>;
}

/**
 * Counts the server's connections per remote address and knows which are idle. A new connection is refused when its
 * address already has maxPerAddress open; when the server nears maxConnections, idle connections are closed first
 * (the longest idle of the address with the most connections), so a flood of idle connections from one place makes
 * room for new clients instead of keeping them out. Node's own server.maxConnections must stay unset: it would
 * refuse at the cap before the guard could close an idle connection.
 */
export function guardConnections(server: Server, options: ConnectionGuardOptions): void {
  const { maxConnections, maxPerAddress } = options;
  const shedAbove = options.shedAbove ?? Math.max(1, Math.floor(maxConnections * 0.9));
  const exempt = options.exempt ?? (() => false);
  const nowMs = options.nowMs ?? Date.now;
  const reportEveryMs = options.reportEveryMs ?? 60_000;
  const peers = new Map<string, Peer>();
  const sockets = new WeakMap<Socket, Tracked>();
  let open = 0;
  const pressure = { refusedPerAddress: 0, refusedFull: 0, shedIdle: 0 };
  let lastReportMs = Number.NEGATIVE_INFINITY;

  const report = () => {
    if (!options.onPressure || nowMs() - lastReportMs < reportEveryMs) return;
    lastReportMs = nowMs();
    let busiest: PressureReport["busiest"] = null;
    for (const peer of peers.values())
      if (!busiest || peer.open > busiest.connections) busiest = { address: peer.address, connections: peer.open };
    options.onPressure({ ...pressure, busiest, open });
    pressure.refusedPerAddress = pressure.refusedFull = pressure.shedIdle = 0;
  };

  const setIdle = (t: Tracked, isIdle: boolean) => {
    if (isIdle) t.peer.idle.add(t);
    else t.peer.idle.delete(t);
  };

  const forget = (t: Tracked) => {
    if (!t.counted) return;
    t.counted = false;
    setIdle(t, false);
    open--;
    if (--t.peer.open === 0) peers.delete(t.peer.address);
  };

  /** Closes the longest-idle connection of the address with the most connections; false when none is idle. */
  const shedOne = (spare: Tracked): boolean => {
    let victimPeer: Peer | null = null;
    for (const peer of peers.values()) {
      const candidates = peer.idle.size - (peer.idle.has(spare) ? 1 : 0);
      if (candidates > 0 && (!victimPeer || peer.open > victimPeer.open)) victimPeer = peer;
    }
    if (!victimPeer) return false;
    for (const t of victimPeer.idle) {
      if (t === spare) continue;
      forget(t);
      t.socket.destroy();
      pressure.shedIdle++;
      return true;
    }
    return false;
  };

  server.on("connection", (socket: Socket) => {
    const address = socket.remoteAddress;
    if (address === undefined || socket.destroyed) return;
    let peer = peers.get(address);
    if (peer && peer.open >= maxPerAddress && !exempt(address)) {
      pressure.refusedPerAddress++;
      socket.destroy();
      report();
      return;
    }
    if (!peer) {
      peer = { address, open: 0, idle: new Set() };
      peers.set(address, peer);
    }
    const t: Tracked = { socket, peer, active: 0, counted: true };
    sockets.set(socket, t);
    peer.open++;
    open++;
    setIdle(t, true);
    socket.once("close", () => forget(t));
    let pressed = false;
    while (open > shedAbove && shedOne(t)) pressed = true;
    if (open > maxConnections) {
      forget(t);
      socket.destroy();
      pressure.refusedFull++;
      pressed = true;
    }
    if (pressed) report();
  });

  server.on("request", (req: IncomingMessage, res: ServerResponse) => {
    const t = sockets.get(req.socket as Socket);
    if (!t?.counted) return;
    t.active++;
    setIdle(t, false);
    res.once("close", () => {
      if (--t.active === 0 && t.counted) setIdle(t, true);
    });
  });

  // Node closes a connection whose keep-alive timeout passed as soon as its timer fires. After the event loop was busy
  // for longer than the timeout, a request that arrived meanwhile is still unread at that moment and the client gets a
  // reset; closing only after this turn's reads (setImmediate) lets such a request be served instead. (Socket timeouts
  // are keep-alive ones here: Fastify's connectionTimeout is 0, and the request deadlines are checked apart.)
  server.on("timeout", (socket: Socket) => {
    const t = sockets.get(socket);
    const readBefore = socket.bytesRead;
    setImmediate(() => {
      if (socket.destroyed || (t && t.active > 0) || socket.bytesRead !== readBefore) return;
      socket.destroy();
    });
  });
}
