import { existsSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { resolveModelFile } from "node-llama-cpp";
import { DEFAULT_EMBEDDED_MODEL } from "../../config-defaults.ts";

/**
 * Where the embedded engine's GGUF model comes from:
 * - a local file path (absolute, or relative to the working directory);
 * - a hub reference, `hf:owner/repo:quant` (e.g. `hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q8_0`) or
 *   `hf:owner/repo/path/file.gguf`, or an `https://` URL of a .gguf file: downloaded once into the
 *   cache folder by node-llama-cpp's own downloader (parallel ranges, progress, resume after an
 *   interruption: the partial download is kept and continued by the next start) and found there,
 *   without any network access, on every later start.
 */

/** The embedded engine's default model (see default-model.ts). */
export const DEFAULT_MODEL_SOURCE = DEFAULT_EMBEDDED_MODEL.source;

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

export interface ResolveModelSourceOptions {
  /** Download folder of hub references and URLs. Default {@link DEFAULT_MODEL_CACHE_DIR}. */
  cacheDir?: string;
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
  constructor(
    message: string,
    readonly publicMessage: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "ModelSourceError";
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

/** The kind of a download failure in words that name no path (the full error goes to the log). */
function downloadProblem(reason: string): string {
  if (/\b(ENOSPC)\b|no space left/i.test(reason)) return "no space is left in the model cache folder";
  if (/\b(EACCES|EPERM|EROFS|ENOTDIR)\b|permission denied|read-only file system/i.test(reason))
    return "the model cache folder cannot be written";
  if (/\b(401|403)\b|unauthori[sz]ed|forbidden/i.test(reason)) return "the hub refused access (a gated model needs HF_TOKEN)";
  if (/\b404\b|not found|does not exist/i.test(reason)) return "the hub has no such model file";
  if (
    /fetch failed|\b(ECONNREFUSED|ECONNRESET|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH)\b|socket|network|timed? ?out/i.test(
      reason,
    )
  ) {
    return "the model hub cannot be reached";
  }
  return "the download failed";
}

/** " (ECONNREFUSED)" when the error's causes carry a system error code. */
function causeCode(err: Error): string {
  for (let e: unknown = err.cause, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string") return ` (${code})`;
  }
  return "";
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
    path = await resolveModelFile(trimmed, {
      directory,
      download: "auto",
      verify: false,
      cli: false,
      deleteTempFileOnCancel: false,
      ...(options.onProgress
        ? {
            onProgress: ({ totalSize, downloadedSize }: { totalSize: number; downloadedSize: number }) =>
              options.onProgress?.({ downloadedBytes: downloadedSize, totalBytes: totalSize }),
          }
        : {}),
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.hubEndpoint ? { endpoints: { huggingFace: options.hubEndpoint } } : {}),
      ...(options.hubToken ? { tokens: { huggingFace: options.hubToken } } : {}),
    });
  } catch (err) {
    if (options.signal?.aborted)
      throw new ModelSourceError(`the download of ${trimmed} was cancelled`, `the download of ${shown} was cancelled`, { cause: err });
    const reason = err instanceof Error ? `${err.message}${causeCode(err)}` : String(err);
    throw new ModelSourceError(
      `cannot download ${trimmed} into ${directory}: ${reason}`,
      `cannot download ${shown}: ${downloadProblem(reason)}`,
      { cause: err },
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
