import { connect } from "node:net";

/**
 * Why a download server cannot be reached at all — its name does not resolve, nothing accepts the connection, no
 * route leads there, or no answer comes — as opposed to a server that answers with an error. node-llama-cpp's
 * downloader reports all of these as "fetch failed" without the system error, so a failed download is followed by
 * one TCP connection to the same host to tell them apart.
 */
export interface NetworkProblem {
  /** host:port that was tried. */
  address: string;
  /** The system error code (ENOTFOUND, EAI_AGAIN, ECONNREFUSED, EHOSTUNREACH, ENETUNREACH, …) or ETIMEDOUT. */
  code: string;
  /** The problem in words: "the name does not resolve (no DNS: offline?)". */
  words: string;
}

const WORDS: Record<string, string> = {
  ENOTFOUND: "the name does not resolve (no DNS answer: offline?)",
  EAI_AGAIN: "the name does not resolve (no DNS server answers: offline?)",
  EAI_FAIL: "the name does not resolve (no DNS server answers: offline?)",
  ECONNREFUSED: "the connection was refused (nothing listens there)",
  EHOSTUNREACH: "the host is unreachable (no route: offline?)",
  ENETUNREACH: "the network is unreachable (offline?)",
  ENETDOWN: "the network is down (offline?)",
  EADDRNOTAVAIL: "no local address can reach it (offline?)",
  ETIMEDOUT: "no answer to the connection (offline, or a firewall?)",
  UND_ERR_CONNECT_TIMEOUT: "no answer to the connection (offline, or a firewall?)",
};

/** The system error codes that mean the host cannot be reached at all. */
export function isNetworkCode(code: string): boolean {
  return Object.hasOwn(WORDS, code);
}

export function networkProblem(address: string, code: string): NetworkProblem {
  return { address, code, words: WORDS[code] ?? code };
}

/** The first system error code among an error's causes that means the host cannot be reached, or null. */
export function networkCodeOf(err: unknown): string | null {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 6; e = e.cause, depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string" && isNetworkCode(code)) return code;
  }
  return null;
}

/** host:port of an http(s) URL (the default port spelled out), or null. */
export function addressOf(url: string): { host: string; port: number } | null {
  try {
    const u = new URL(url);
    if (u.protocol !== "http:" && u.protocol !== "https:") return null;
    return { host: u.hostname.replace(/^\[|\]$/g, ""), port: Number(u.port || (u.protocol === "https:" ? 443 : 80)) };
  } catch {
    return null;
  }
}

/**
 * Opens (and closes at once) one TCP connection to the URL's host: the problem when it cannot be reached, null when
 * the connection is accepted (or the URL has no host, or `signal` fires first).
 */
export function probeReachability(url: string, signal?: AbortSignal, timeoutMs = 5000): Promise<NetworkProblem | null> {
  const target = addressOf(url);
  if (target === null || signal?.aborted) return Promise.resolve(null);
  const address = `${target.host}:${target.port}`;
  return new Promise((resolve) => {
    const socket = connect({ host: target.host, port: target.port });
    const done = (result: NetworkProblem | null) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", aborted);
      socket.destroy();
      resolve(result);
    };
    const aborted = () => done(null);
    const timer = setTimeout(() => done(networkProblem(address, "ETIMEDOUT")), timeoutMs);
    signal?.addEventListener("abort", aborted, { once: true });
    socket.once("connect", () => done(null));
    socket.once("error", (err: NodeJS.ErrnoException) => {
      const code = typeof err.code === "string" ? err.code : "";
      done(isNetworkCode(code) ? networkProblem(address, code) : null);
    });
  });
}
