import { existsSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { resolveModelFile } from "node-llama-cpp";
import { DEFAULT_EMBEDDED_MODEL } from "./default-model.ts";

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

export class ModelSourceError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ModelSourceError";
  }
}

/** The local path of the model file; downloads it first for a hub reference or URL not yet in the cache. */
export async function resolveModelSource(source: string, options: ResolveModelSourceOptions = {}): Promise<string> {
  const trimmed = source.trim();
  if (trimmed === "") throw new ModelSourceError("no model source given");
  const kind = modelSourceKind(trimmed);

  if (kind === "file") {
    const path = resolve(trimmed);
    if (!existsSync(path)) throw new ModelSourceError(`no model file at ${path}`);
    const stat = statSync(path);
    if (!stat.isFile()) throw new ModelSourceError(`${path} is not a file`);
    return path;
  }

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
    if (options.signal?.aborted) throw new ModelSourceError(`the download of ${trimmed} was cancelled`, { cause: err });
    const reason = err instanceof Error ? err.message : String(err);
    throw new ModelSourceError(`cannot download ${trimmed} into ${directory}: ${reason}`, { cause: err });
  }
  // A cancelled download returns the path it would have written; the partial file stays for a resume.
  if (options.signal?.aborted) throw new ModelSourceError(`the download of ${trimmed} was cancelled`);
  if (!existsSync(path)) throw new ModelSourceError(`the download of ${trimmed} did not complete (no file at ${path})`);
  return path;
}
