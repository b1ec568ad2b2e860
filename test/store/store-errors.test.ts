import assert from "node:assert/strict";
import { test } from "node:test";
import { isStoreUnavailable } from "../../src/store/store-errors.ts";

test("storage outages (503) are told apart from bad input and bugs", () => {
  for (const code of ["SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR_WRITE", "SQLITE_FULL", "57P01", "57014", "08006", "53100", "55P03", "40001", "ECONNREFUSED", "ETIMEDOUT"]) {
    assert.equal(isStoreUnavailable(Object.assign(new Error(code), { code })), true, code);
  }
  for (const code of ["SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_CHECK", "23505", "23514", "3D000", "28P01", "42P01"]) {
    assert.equal(isStoreUnavailable(Object.assign(new Error(code), { code })), false, code);
  }
  assert.equal(isStoreUnavailable(new Error("Connection terminated unexpectedly")), true);
  assert.equal(isStoreUnavailable(new Error("something else")), false);
  assert.equal(isStoreUnavailable("SQLITE_BUSY"), false);
});
