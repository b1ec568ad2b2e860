import assert from "node:assert/strict";
import { test } from "node:test";
import { ServiceError } from "../../src/domain/errors.ts";
import { postgresFailureKind } from "../../src/store/postgres/postgres-errors.ts";
import { sqliteFailureKind } from "../../src/store/sqlite/sqlite-errors.ts";
import { openSqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { StoreConflictError, StoreInputError } from "../../src/store/store-errors.ts";

const err = (code: string) => Object.assign(new Error(code), { code });

test("SQLite's storage failures (503) are told apart from bad input and bugs", () => {
  for (const code of ["SQLITE_BUSY", "SQLITE_BUSY_SNAPSHOT", "SQLITE_LOCKED"])
    assert.equal(sqliteFailureKind(err(code)), "retryable", code);
  for (const code of ["SQLITE_IOERR_WRITE", "SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PROTOCOL"]) {
    assert.equal(sqliteFailureKind(err(code)), "unavailable", code);
  }
  assert.equal(sqliteFailureKind(new TypeError("The database connection is not open")), "unavailable", "a closed SQLite connection");
  for (const code of ["SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_CHECK", "SQLITE_ERROR"])
    assert.equal(sqliteFailureKind(err(code)), "other", code);
  assert.equal(sqliteFailureKind(new Error("something else")), "other");
  assert.equal(sqliteFailureKind("SQLITE_BUSY"), "other");
  assert.equal(sqliteFailureKind(null), "other");
});

test("PostgreSQL's and the network's storage failures (503) are told apart from bad input and bugs", () => {
  for (const code of ["40001", "40P01", "55P03"]) assert.equal(postgresFailureKind(err(code)), "retryable", code);
  for (const code of [
    "57P01",
    "57014",
    "08006",
    "53100",
    "ECONNREFUSED",
    "ETIMEDOUT",
    // The database dropped or renamed, the login refused (a password changed) under a running gateway: outages too.
    "3D000",
    "28P01",
  ]) {
    assert.equal(postgresFailureKind(err(code)), "unavailable", code);
  }
  assert.equal(postgresFailureKind(new Error("Connection terminated unexpectedly")), "unavailable");
  for (const code of ["23505", "23514", "42P01", "22021"]) assert.equal(postgresFailureKind(err(code)), "other", code);
  assert.equal(postgresFailureKind(new Error("something else")), "other");
  assert.equal(postgresFailureKind("57P01"), "other");
  assert.equal(postgresFailureKind(undefined), "other");
});

test("each adapter reads only its own driver's codes, through its store; the port knows none", async () => {
  assert.equal(sqliteFailureKind(err("40001")), "other");
  assert.equal(sqliteFailureKind(err("ECONNREFUSED")), "other");
  assert.equal(postgresFailureKind(err("SQLITE_BUSY")), "other");
  const store = openSqliteStore(":memory:");
  try {
    assert.equal(store.classifyFailure(err("SQLITE_LOCKED")), "retryable");
    assert.equal(store.classifyFailure(err("SQLITE_FULL")), "unavailable");
    assert.equal(store.classifyFailure(err("57P01")), "other");
    const { classifyFailure } = store;
    assert.equal(classifyFailure(err("SQLITE_BUSY")), "retryable", "needs no `this`");
  } finally {
    await store.close();
  }
});

test("both store errors are ServiceErrors from the catalogue: bad input 422, a conflict 500 unless its caller maps it", () => {
  const input = new StoreInputError("limit must be a whole number from 1 to 200", "limit");
  assert.ok(input instanceof ServiceError);
  assert.equal(input.code, "invalid_query");
  assert.equal(input.status, 422);
  assert.deepEqual(input.extra.errors, [{ field: "query.limit", message: "limit must be a whole number from 1 to 200" }]);
  const conflict = new StoreConflictError('An organization named "Acme" already exists');
  assert.ok(conflict instanceof ServiceError);
  assert.equal(conflict.code, "internal");
  assert.equal(conflict.status, 500);
  assert.equal(conflict.detail, undefined, "the answer is the catalogue's; stored values stay out of it");
  assert.equal(conflict.message, 'An organization named "Acme" already exists');
  assert.equal(conflict.name, "StoreConflictError");
});
