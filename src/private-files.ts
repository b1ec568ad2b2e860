import { randomBytes } from "node:crypto";
import {
  chmodSync,
  closeSync,
  constants,
  fchmodSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readlinkSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { dirname, resolve } from "node:path";

/**
 * Files and folders only their owner can read. Modes are set explicitly after creation (fchmod/chmod),
 * so they do not depend on the umask; files are created with O_EXCL and never follow a symbolic link.
 */
export const PRIVATE_DIR_MODE = 0o700;
export const PRIVATE_FILE_MODE = 0o600;

const EXCLUSIVE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

function errorCode(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException | null)?.code;
}

/** Creates `dir` and its missing parents with mode 0700; folders that exist keep their mode. Returns the folders it created. */
export function makePrivateDir(dir: string): string[] {
  const missing: string[] = [];
  for (let d = resolve(dir); statSync(d, { throwIfNoEntry: false }) === undefined; d = dirname(d)) {
    missing.unshift(d);
    if (dirname(d) === d) break;
  }
  const created: string[] = [];
  for (const d of missing) {
    try {
      mkdirSync(d, { mode: PRIVATE_DIR_MODE });
    } catch (err) {
      if (errorCode(err) === "EEXIST") continue; // another process made it at the same moment
      throw err;
    }
    chmodSync(d, PRIVATE_DIR_MODE);
    created.push(d);
  }
  return created;
}

/** Creates an empty file with mode 0600 unless something exists at `path`. Returns true when it created the file. */
export function createPrivateFile(path: string): boolean {
  let fd: number;
  try {
    fd = openSync(path, EXCLUSIVE, PRIVATE_FILE_MODE);
  } catch (err) {
    if (errorCode(err) === "EEXIST") return false;
    throw err;
  }
  try {
    fchmodSync(fd, PRIVATE_FILE_MODE);
  } finally {
    closeSync(fd);
  }
  return true;
}

/** Where the symbolic link at `path` points (dangling or not), or null when `path` is not a link (or does not exist). */
export function symbolicLinkAt(path: string): string | null {
  const stat = lstatSync(path, { throwIfNoEntry: false });
  return stat?.isSymbolicLink() ? readlinkSync(path) : null;
}

/** True when group or others may read the file or folder at `path` (false when it does not exist). */
export function readableByOthers(path: string): { readable: boolean; mode: number } {
  const stat = statSync(path, { throwIfNoEntry: false });
  const mode = stat ? stat.mode & 0o777 : 0;
  return { readable: (mode & 0o044) !== 0, mode };
}

export function octal(mode: number): string {
  return `0${(mode & 0o777).toString(8).padStart(3, "0")}`;
}

export interface PendingPrivateFile {
  readonly path: string;
  /** Writes `text`, flushes it and moves it to `path` (replacing whatever file is there). */
  commit(text: string): void;
  /** Removes the temporary file; `path` is left untouched. */
  discard(): void;
}

/**
 * Prepares a private file at `path` (its folder made with makePrivateDir): a temporary 0600 file next to
 * it is created now, so that a folder that cannot be written fails before anything is decided; commit()
 * fills it and renames it over `path`, which replaces a link rather than writing through it.
 */
export function preparePrivateFile(path: string): PendingPrivateFile {
  const target = resolve(path);
  const existing = statSync(target, { throwIfNoEntry: false });
  if (existing?.isDirectory()) throw new Error(`${target} is a folder, not a file`);
  makePrivateDir(dirname(target));
  const temp = `${target}.${randomBytes(6).toString("hex")}.tmp`;
  let fd: number | null = openSync(temp, EXCLUSIVE, PRIVATE_FILE_MODE);
  try {
    fchmodSync(fd, PRIVATE_FILE_MODE);
  } catch (err) {
    closeSync(fd);
    unlinkSync(temp);
    throw err;
  }
  const close = () => {
    if (fd === null) return;
    const open = fd;
    fd = null;
    closeSync(open);
  };
  return {
    path: target,
    commit(text) {
      if (fd === null) throw new Error("the file was already committed or discarded");
      try {
        writeSync(fd, text);
        fsyncSync(fd);
        close();
        renameSync(temp, target);
      } catch (err) {
        close();
        try {
          unlinkSync(temp);
        } catch {
          // already gone
        }
        throw err;
      }
    },
    discard() {
      close();
      try {
        unlinkSync(temp);
      } catch {
        // already gone
      }
    },
  };
}
