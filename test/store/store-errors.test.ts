import assert from "node:assert/strict";
import { test } from "node:test";
import { postgresFailureKind } from "../../src/store/postgres/postgres-errors.ts";
import { sqliteFailureKind } from "../../src/store/sqlite/sqlite-errors.ts";
import { isStoreRetryable, isStoreUnavailable } from "../../src/store/store-errors.ts";

test("storage outages (503) are told apart from bad input and bugs", () => {
  for (const code of [
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR_WRITE",
    "SQLITE_FULL",
    "57P01",
    "57014",
    "08006",
    "53100",
    "55P03",
    "40001",
    "ECONNREFUSED",
    "ETIMEDOUT",
    // The database dropped or renamed, the login refused (a password changed) under a running gateway: outages too.
    "3D000",
    "28P01",
  ]) {
    assert.equal(isStoreUnavailable(Object.assign(new Error(code), { code })), true, code);
  }
  assert.equal(isStoreUnavailable(new TypeError("The database connection is not open")), true, "a closed SQLite connection");
  for (const code of ["SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_CHECK", "23505", "23514", "42P01"]) {
    assert.equal(isStoreUnavailable(Object.assign(new Error(code), { code })), false, code);
  }
  assert.equal(isStoreUnavailable(new Error("Connection terminated unexpectedly")), true);
  assert.equal(isStoreUnavailable(new Error("something else")), false);
  assert.equal(isStoreUnavailable("SQLITE_BUSY"), false);
});

test("each adapter reads only its own driver's codes; the port knows none", () => {
  const err = (code: string) => Object.assign(new Error(code), { code });
  assert.equal(sqliteFailureKind(err("SQLITE_BUSY")), "retryable");
  assert.equal(sqliteFailureKind(err("SQLITE_FULL")), "unavailable");
  assert.equal(sqliteFailureKind(err("40001")), null);
  assert.equal(postgresFailureKind(err("40001")), "retryable");
  assert.equal(postgresFailureKind(err("57P01")), "unavailable");
  assert.equal(postgresFailureKind(err("SQLITE_BUSY")), null);
  assert.equal(isStoreRetryable(err("SQLITE_LOCKED")), true);
  assert.equal(isStoreRetryable(err("SQLITE_FULL")), false);
  assert.equal(isStoreRetryable(err("40P01")), true);
});
