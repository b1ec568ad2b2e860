import { existsSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { createModelDownloader, resolveModelFile } from "node-llama-cpp";
import { DEFAULT_EMBEDDED_MODEL } from "../../config-defaults.ts";
import { addressOf, type NetworkProblem, networkCodeOf, networkProblem, probeReachability } from "./network-probe.ts";

/**
 * Where the embedded engine's GGUF model comes from:
 * - a local file path (absolute, or relative to the working directory);
 * - a hub reference, `hf:owner/repo:quant` (e.g. `hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q8_0`) or
 *   `hf:owner/repo/path/file.gguf`, or an `https://` URL of a .gguf file: downloaded once into the
 *   cache folder by node-llama-cpp's own downloader (parallel ranges, progress, resume after an
 *   interruption: the partial download is kept and continued by the next start) and found there,
 *   without any network access, on every later start.
 */

/** The embedded engine's default model (see config-defaults.ts). */
export const DEFAULT_MODEL_SOURCE = DEFAULT_EMBEDDED_MODEL.source;

/** The size of {@link DEFAULT_MODEL_SOURCE}'s file, for messages written before the hub has told it. */
export const DEFAULT_MODEL_APPROX_MB = 531;

/** Where hub references are downloaded to, relative to the working directory. */
export const DEFAULT_MODEL_CACHE_DIR = "./data/models";

export type ModelSourceKind = "file" | "hub" | "url";

const HUB_PREFIXES = ["hf:", "hf://", "huggingface:", "huggingface://"];

export function modelSourceKind(source: string): ModelSourceKind {
  const s = source.trim();
  if (HUB_PREFIXES.some((p) => s.startsWith(p))) return "hub";
  if (/^https?:\/\//i.test(s)) return "url";
  return "file";
}

export interface DownloadProgress {
  downloadedBytes: number;
  totalBytes: number;
}

/** A download about to start: its size as the server says it, and the bytes a partial download already holds. */
export interface DownloadStart {
  totalBytes: number;
  /** True when a partial download is there to be continued. */
  resuming: boolean;
  /** The absolute download folder. */
  directory: string;
}

export interface ResolveModelSourceOptions {
  /** Download folder of hub references and URLs. Default {@link DEFAULT_MODEL_CACHE_DIR}. */
  cacheDir?: string;
  /** Called once the server has told the file's size, before its bytes are fetched (not when the file is already there). */
  onDownloadStart?: (start: DownloadStart) => void;
  /** Called as a download progresses (not called when the file is already there). */
  onProgress?: (progress: DownloadProgress) => void;
  /** Cancels a download; the partial file is kept, and the next attempt resumes it. */
  signal?: AbortSignal;
  /**
   * Base URL of the model hub, for mirrors and tests. Default: node-llama-cpp's (`MODEL_ENDPOINT` or
   * `HF_ENDPOINT` from the environment, else the public hub).
   */
  hubEndpoint?: string;
  /** Hub access token for gated models. Default: node-llama-cpp's (`HF_TOKEN` from the environment). */
  hubToken?: string;
}

/**
 * `message` names paths and the underlying error, for the server log; `publicMessage` says the same
 * without any file-system path, for API clients.
 */
export class ModelSourceError extends Error {
  /** Set when the download server could not be reached at all (no DNS answer, refused, unreachable): offline? */
  readonly network: NetworkProblem | null;

  constructor(
    message: string,
    readonly publicMessage: string,
    options?: { cause?: unknown; network?: NetworkProblem | null },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ModelSourceError";
    this.network = options?.network ?? null;
  }
}

/** How a source may be shown to API clients: a hub reference as it is, a URL without credentials or query. */
export function publicSourceName(source: string): string {
  const s = source.trim();
  switch (modelSourceKind(s)) {
    case "hub":
      return s;
    case "url":
      try {
        const u = new URL(s);
        return `${u.protocol}//${u.host}${u.pathname}`;
      } catch {
        return "the model URL";
      }
    case "file":
      return "the model file";
  }
}

/**
 * The kind of a download failure in words that name no path (the full error goes to the log). `network`: the server
 * cannot be reached at all; `probed`: a connection to it was tried after the failure and was accepted.
 */
export function downloadProblem(reason: string, server: string, network: NetworkProblem | null, probed = false): string {
  if (network !== null) return `${server} cannot be reached`;
  if (/\b(ENOSPC)\b|no space left/i.test(reason)) return "no space is left in the model cache folder";
  if (/\b(EACCES|EPERM|EROFS|ENOTDIR)\b|permission denied|read-only file system/i.test(reason))
    return "the model cache folder cannot be written";
  if (/\b(401|403)\b|unauthori[sz]ed|forbidden/i.test(reason)) return `${server} refused access (a gated model needs HF_TOKEN)`;
  if (/\b404\b|not found|does not exist/i.test(reason)) return `${server} has no such model file`;
  const status = /\b(5\d\d)\b/.exec(reason);
  if (status) return `${server} answered with a server error (HTTP ${status[1]})`;
  if (/fetch failed|\b(ECONNRESET|ETIMEDOUT)\b|socket|network|timed? ?out/i.test(reason)) {
    return probed ? `the connection to ${server} failed` : `${server} cannot be reached`;
  }
  return "the download failed";
}

/** " (ECONNRESET)" when the error's causes carry a system error code. */
function causeCode(err: Error): string {
  for (let e: unknown = err.cause, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string") return ` (${code})`;
  }
  return "";
}

/** The base URL node-llama-cpp resolves hub references against (its own rule: the option, MODEL_ENDPOINT, HF_ENDPOINT). */
function hubBaseUrl(hubEndpoint: string | undefined): string {
  for (const candidate of [hubEndpoint, process.env.MODEL_ENDPOINT, process.env.HF_ENDPOINT]) {
    if (candidate && addressOf(candidate) !== null) return candidate;
  }
  return "https://huggingface.co/";
}

/**
 * Whether a failed download could not reach its server at all: from the error's own system code, else (node-llama-cpp
 * keeps only "fetch failed") from one connection to the server.
 */
async function networkFailure(
  err: unknown,
  reason: string,
  serverUrl: string,
  signal?: AbortSignal,
): Promise<{ network: NetworkProblem | null; probed: boolean }> {
  const target = addressOf(serverUrl);
  const address = target ? `${target.host}:${target.port}` : serverUrl;
  const code = networkCodeOf(err);
  if (code !== null) return { network: networkProblem(address, code), probed: false };
  if (!/fetch failed|\bsocket\b|network|timed? ?out/i.test(reason)) return { network: null, probed: false };
  const network = await probeReachability(serverUrl, signal);
  return { network, probed: network === null && !signal?.aborted };
}

/** Runs the downloads of one file one after the other (two engines on one source share the cache folder). */
const downloadsInFlight = new Map<string, Promise<unknown>>();
async function oneAtATime<T>(key: string, work: () => Promise<T>): Promise<T> {
  const before = downloadsInFlight.get(key) ?? Promise.resolve();
  const mine = before.then(work, work);
  const settled = mine.then(
    () => {},
    () => {},
  );
  downloadsInFlight.set(key, settled);
  try {
    return await mine;
  } finally {
    if (downloadsInFlight.get(key) === settled) downloadsInFlight.delete(key);
  }
}

/** The file of a hub reference or URL: from the cache folder when it is there, else downloaded into it. */
async function downloadModel(source: string, directory: string, options: ResolveModelSourceOptions): Promise<string> {
  const access = {
    ...(options.hubEndpoint ? { endpoints: { huggingFace: options.hubEndpoint } } : {}),
    ...(options.hubToken ? { tokens: { huggingFace: options.hubToken } } : {}),
  };
  try {
    return await resolveModelFile(source, { directory, download: false, verify: false, cli: false, ...access });
  } catch {
    // Not in the cache folder yet.
  }
  return oneAtATime(`${directory}\n${source}`, async () => {
    const downloader = await createModelDownloader({
      modelUri: source,
      dirPath: directory,
      showCliProgress: false,
      deleteTempFileOnCancel: false,
      skipExisting: true,
      ...(options.onProgress
        ? {
            onProgress: ({ totalSize, downloadedSize }: { totalSize: number; downloadedSize: number }) =>
              options.onProgress?.({ downloadedBytes: downloadedSize, totalBytes: totalSize }),
          }
        : {}),
      ...access,
    });
    const path = downloader.entrypointFilePath;
    try {
      if (existsSync(path)) {
        await downloader.cancel({ deleteTempFile: false });
        return path;
      }
      options.onDownloadStart?.({ totalBytes: downloader.totalSize, resuming: existsSync(`${path}.ipull`), directory });
      return await downloader.download(options.signal ? { signal: options.signal } : {});
    } catch (err) {
      await downloader.cancel({ deleteTempFile: false }).catch(() => {});
      throw err;
    }
  });
}

/** The local path of the model file; downloads it first for a hub reference or URL not yet in the cache. */
export async function resolveModelSource(source: string, options: ResolveModelSourceOptions = {}): Promise<string> {
  const trimmed = source.trim();
  if (trimmed === "") throw new ModelSourceError("no model source given", "no model source given");
  const kind = modelSourceKind(trimmed);

  if (kind === "file") {
    const path = resolve(trimmed);
    if (!existsSync(path)) throw new ModelSourceError(`no model file at ${path}`, "no model file at the configured path");
    const stat = statSync(path);
    if (!stat.isFile()) throw new ModelSourceError(`${path} is not a file`, "the configured path is not a file");
    return path;
  }
  const shown = publicSourceName(trimmed);

  const directory = resolve(options.cacheDir ?? DEFAULT_MODEL_CACHE_DIR);
  let path: string;
  try {
    path = await downloadModel(trimmed, directory, options);
  } catch (err) {
    if (options.signal?.aborted)
      throw new ModelSourceError(`the download of ${trimmed} was cancelled`, `the download of ${shown} was cancelled`, { cause: err });
    const reason = err instanceof Error ? `${err.message}${causeCode(err)}` : String(err);
    const serverUrl = kind === "hub" ? hubBaseUrl(options.hubEndpoint) : trimmed;
    const { network, probed } = await networkFailure(err, reason, serverUrl, options.signal);
    const server = kind === "hub" ? "the model hub" : "the download server";
    const where = network ? `; ${network.address}: ${network.words} (${network.code})` : "";
    throw new ModelSourceError(
      `cannot download ${trimmed} into ${directory}: ${reason}${where}`,
      `cannot download ${shown}: ${downloadProblem(reason, server, network, probed)}`,
      { cause: err, network },
    );
  }
  // A cancelled download returns the path it would have written; the partial file stays for a resume.
  if (options.signal?.aborted)
    throw new ModelSourceError(`the download of ${trimmed} was cancelled`, `the download of ${shown} was cancelled`);
  if (!existsSync(path)) {
    throw new ModelSourceError(
      `the download of ${trimmed} did not complete (no file at ${path})`,
      `the download of ${shown} did not complete`,
    );
  }
  return path;
}
