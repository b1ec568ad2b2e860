/**
 * The PostgreSQL server restarted while a paid gateway serves concurrent requests, on a private throwaway cluster
 * (test/support/private-postgres.ts; the shared server on 127.0.0.1:5432 is never restarted): once with `pg_ctl
 * restart -m fast` (backends terminated, a clean shutdown) and once with `-m immediate` (no shutdown: crash recovery
 * at the next start). The gateway is a real `src/server.ts` process in front of the fake model server. Every request
 * is answered in time with 200 or the documented 503 (never a 500, never a hang); the same gateway process serves
 * again once the server is back; and after the sweep (a short reservation TTL) the books are exact: each 200 charged
 * once with the cost it showed, no failed request charged, every reservation resolved exactly once, the ledger equal
 * to the balance, the daily roll-up equal to the records, nothing left in flight. A 503 whose completion committed
 * just before its connection died is charged once, as a success (the client cannot tell; counted in the
 * diagnostics). Skipped with TDS_SKIP_POSTGRES=1, or when no PostgreSQL server binaries are installed.
 */
import assert from "node:assert/strict";
import { type TestContext, test } from "node:test";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { openStore } from "../../src/store/open-store.ts";
import type { Store } from "../../src/store/store.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { allUsage, assertLedgerMatches } from "../support/books.ts";
import { sampleRequest } from "../support/gateway-harness.ts";
import { type GatewayProcess, startGatewayProcess } from "../support/gateway-process.ts";
import { type PrivatePostgres, privatePostgresUnavailable, type RestartMode, startPrivatePostgres } from "../support/private-postgres.ts";
import { assertRollUpExact, reservationStatuses, rowsOf } from "../support/roll-up.ts";

/** Paid, with a short reservation TTL so that the sweep (every 5 s in the server) resolves what a restart left. */
const PAID = {
  TDS_SERVICE_MODE: "paid",
  TDS_PRICE_PER_MILLION_INPUT_USD: "1",
  TDS_MODEL_TIMEOUT_MS: "2000",
  TDS_RESERVATION_TTL_SECONDS: "6",
};
const GRANT = 50_000_000;
const WORKERS = 8;
/** The restart begins once this many requests of the round were answered… */
const ANSWERS_BEFORE_RESTART = 40;
/** …and the round ends once this many requests sent after the server was back were answered. */
const ANSWERS_AFTER_RESTART = 40;
/** Bounds against a runaway round (counted) and against hanging (timed); neither is what a passing round meets. */
const MAX_REQUESTS_PER_ROUND = 500;
const ROUND_LIMIT_MS = 45_000;
const ANSWER_LIMIT_MS = 20_000;
/** A client pausing after a 503 (as a polite one would), so a round does not burn its requests while the server is down. */
const PAUSE_AFTER_503_MS = 100;
/** The reservation TTL, the sweep interval (5 s) and room for a busy machine. */
const SETTLE_LIMIT_MS = 30_000;
const STORAGE_UNAVAILABLE = /Storage is temporarily unavailable/;

interface Answer {
  round: string;
  status: number;
  requestId: string | null;
  /** usage.cost_microusd of a 200. */
  cost: number | null;
  body: string;
  sentAtMs: number;
  answeredAtMs: number;
}

interface Setup {
  cluster: PrivatePostgres;
  store: Store;
  gateway: GatewayProcess;
  orgId: string;
  key: string;
  answers: Answer[];
}

/** One paid request; its answer is kept in `s.answers` (status 0: no answer in time, or the connection broke). */
async function post(s: Setup, round: string, state: Record<string, unknown>): Promise<Answer> {
  const sentAtMs = Date.now();
  let answer: Omit<Answer, "answeredAtMs">;
  try {
    const res = await fetch(`${s.gateway.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.key}`, "content-type": "application/json" },
      body: JSON.stringify(sampleRequest({ state })),
      signal: AbortSignal.timeout(ANSWER_LIMIT_MS),
    });
    const body = await res.text();
    const cost = res.status === 200 ? (JSON.parse(body) as { usage: { cost_microusd: number } }).usage.cost_microusd : null;
    answer = { round, status: res.status, requestId: res.headers.get("x-service-request-id"), cost, body, sentAtMs };
  } catch (err) {
    answer = { round, status: 0, requestId: null, cost: null, body: String(err), sentAtMs };
  }
  const answered = { ...answer, answeredAtMs: Date.now() };
  s.answers.push(answered);
  return answered;
}

interface RoundFigures {
  restartMs: number;
  restartStartedAtMs: number;
  restartEndedAtMs: number;
}

/**
 * Paid requests from WORKERS concurrent clients; after ANSWERS_BEFORE_RESTART answers the cluster is restarted, and
 * the round goes on until ANSWERS_AFTER_RESTART requests sent after the server was back have been answered.
 */
async function restartUnderLoad(s: Setup, mode: RestartMode): Promise<RoundFigures> {
  const round: Answer[] = [];
  const limit = Date.now() + ROUND_LIMIT_MS;
  let sent = 0;
  const restart: { outcome: Promise<number | Error> | null; startedAtMs: number; endedAtMs: number } = {
    outcome: null,
    startedAtMs: 0,
    endedAtMs: 0,
  };
  const answeredAfterRestart = () => round.filter((a) => restart.endedAtMs > 0 && a.sentAtMs >= restart.endedAtMs).length;
  const worker = async (w: number) => {
    while (answeredAfterRestart() < ANSWERS_AFTER_RESTART && sent < MAX_REQUESTS_PER_ROUND && Date.now() < limit) {
      const i = sent++;
      // The model takes a little time, so the restart lands before, during and after model calls.
      const answer = await post(s, mode, { fake_behavior: `delay:${5 + (i % 4) * 10}`, mode, w, i });
      round.push(answer);
      if (!restart.outcome && round.length >= ANSWERS_BEFORE_RESTART) {
        restart.startedAtMs = Date.now();
        restart.outcome = s.cluster
          .restart(mode)
          .catch((err: Error) => err)
          .finally(() => (restart.endedAtMs = Date.now()));
      }
      if (answer.status === 503) await new Promise((r) => setTimeout(r, PAUSE_AFTER_503_MS));
    }
  };
  await Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));
  assert.ok(restart.outcome, `the restart began (${round.length} answers)`);
  const restartMs = await restart.outcome;
  if (restartMs instanceof Error) throw restartMs;
  return { restartMs, restartStartedAtMs: restart.startedAtMs, restartEndedAtMs: restart.endedAtMs };
}

/** Every answer of the round is a 200 or the storage 503, in time; the restart came under load, and the gateway serves after it. */
function assertAnswers(t: TestContext, s: Setup, mode: RestartMode, figures: RoundFigures): void {
  const round = s.answers.filter((a) => a.round === mode);
  for (const a of round) {
    assert.ok(a.status === 200 || a.status === 503, `status ${a.status} (request ${a.requestId}): ${a.body}`);
    if (a.status === 503) assert.match((JSON.parse(a.body) as { detail: string }).detail, STORAGE_UNAVAILABLE, a.body);
  }
  const failed = round.filter((a) => a.status === 503);
  const after = round.filter((a) => a.sentAtMs >= figures.restartEndedAtMs);
  const since = (ms: number) => `${ms - figures.restartStartedAtMs} ms`;
  t.diagnostic(
    `${mode} restart: pg_ctl took ${figures.restartMs} ms; ${round.length} requests, ${round.length - failed.length} × 200, ` +
      `${failed.length} × 503` +
      (failed.length > 0
        ? ` (answered from ${since(Math.min(...failed.map((a) => a.answeredAtMs)))} to ${since(Math.max(...failed.map((a) => a.answeredAtMs)))} after the restart began)`
        : ""),
  );
  const firstOk = after.filter((a) => a.status === 200).sort((a, b) => a.answeredAtMs - b.answeredAtMs)[0];
  t.diagnostic(
    `${mode} restart: first 200 of a request sent after pg_ctl returned: ${firstOk ? since(firstOk.answeredAtMs) : "none"} after the restart began; ` +
      `${after.filter((a) => a.status === 503).length} of ${after.length} requests sent after it got 503`,
  );
  // Whether a request meets the server down (503) depends on how the cores were shared; being in flight does not.
  const inFlight = round.filter((a) => a.sentAtMs <= figures.restartStartedAtMs && a.answeredAtMs >= figures.restartStartedAtMs);
  assert.ok(inFlight.length > 0, "requests were in flight when the restart began: it happened under load");
  assert.ok(firstOk, "the gateway answered 200 again after the restart, without being restarted itself");
  assert.ok(s.gateway.child.exitCode === null && s.gateway.child.signalCode === null, "the gateway process is still running");
}

/** Waits until the sweep has resolved everything the restart left (nothing in flight, nothing reserved). */
async function waitForSweep(s: Setup): Promise<number> {
  const startedAt = Date.now();
  for (;;) {
    try {
      const inFlight = (await allUsage(s.store, s.orgId)).filter((r) => r.outcome === "in_flight").length;
      const { reserved } = await s.store.getBalance(s.orgId);
      if (inFlight === 0 && reserved === 0) return Date.now() - startedAt;
      if (Date.now() - startedAt > SETTLE_LIMIT_MS) {
        assert.fail(`after ${SETTLE_LIMIT_MS} ms still ${inFlight} requests in flight and ${reserved} µUSD reserved`);
      }
    } catch (err) {
      // The test's own pool may still hold a connection from before the restart: the next poll opens a new one.
      if (err instanceof assert.AssertionError || Date.now() - startedAt > SETTLE_LIMIT_MS) throw err;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * The books after the sweep, over every request the test sent: exact ledger and roll-up, each 200 charged once with
 * its cost, nothing charged for a failure, each record with exactly one reservation resolved exactly once.
 */
async function assertBooksExact(t: TestContext, s: Setup): Promise<void> {
  const records = await allUsage(s.store, s.orgId);
  const byRequest = new Map(records.map((r) => [r.requestId, r]));
  const sentIds = new Set(s.answers.map((a) => a.requestId));
  assert.deepEqual(
    records.filter((r) => !sentIds.has(r.requestId)).map((r) => r.requestId),
    [],
    "every record is of a request the test sent",
  );
  assert.deepEqual(
    records.filter((r) => r.outcome === "in_flight").map((r) => r.requestId),
    [],
    "no request left in flight",
  );
  for (const a of s.answers.filter((x) => x.status === 200)) {
    const record = byRequest.get(a.requestId!);
    assert.deepEqual([record?.outcome, record?.costMicrousd], ["succeeded", a.cost], `the 200 of ${a.requestId} charged once, as shown`);
  }
  for (const r of records.filter((x) => x.outcome !== "succeeded"))
    assert.equal(r.costMicrousd, 0, `failed ${r.requestId} charged nothing`);
  const succeeded = records.filter((r) => r.outcome === "succeeded");
  const spent = succeeded.reduce((sum, r) => sum + r.costMicrousd, 0);
  const balance = await assertLedgerMatches(s.store, s.orgId);
  assert.deepEqual(balance, { available: GRANT - spent, reserved: 0, spent, granted: GRANT }, "charged exactly the succeeded records");

  // One reservation per record, resolved exactly once: settled for the cost of a success, released or expired otherwise.
  const statuses = await reservationStatuses(s.store);
  assert.equal(statuses.pending, undefined, "no reservation pending");
  const reservations = await rowsOf(
    s.store,
    "SELECT request_id, reservation_status AS status, cost_microusd FROM usage_records WHERE reservation_status IS NOT NULL",
  );
  assert.equal(reservations.length, records.length, "one reservation per record");
  for (const r of reservations) {
    const record = byRequest.get(r.request_id as string);
    assert.ok(record, `reservation of ${r.request_id} has its record`);
    if (record.outcome === "succeeded") assert.deepEqual([r.status, r.cost_microusd], ["settled", record.costMicrousd], record.requestId);
    else assert.ok(r.status === "released" || r.status === "expired", `${record.requestId} (${record.outcome}): reservation ${r.status}`);
  }
  await assertRollUpExact(s.store);

  // How the admitted 503s ended: completed again after the answer (http_status 503) or by the sweep (none), or
  // charged as a success when their completion had committed just before the connection died.
  const reservationOf = new Map(reservations.map((r) => [r.request_id as string, r.status as string]));
  const ends = new Map<string, number>();
  for (const a of s.answers.filter((x) => x.status === 503)) {
    const record = byRequest.get(a.requestId!);
    const end = record
      ? `${record.outcome} (http_status ${record.httpStatus}, reservation ${reservationOf.get(record.requestId)})`
      : "not admitted";
    ends.set(end, (ends.get(end) ?? 0) + 1);
  }
  t.diagnostic(`503s so far, by how they ended: ${[...ends].map(([end, n]) => `${n} ${end}`).join("; ")}`);
}

test("the PostgreSQL server restarted (fast, then immediate) under concurrent paid requests: 200 or 503, books exact, serves again", {
  skip: process.env.TDS_SKIP_POSTGRES === "1" ? "TDS_SKIP_POSTGRES=1" : (privatePostgresUnavailable() ?? false),
  timeout: 240_000,
}, async (t) => {
  const cluster = await startPrivatePostgres((stop) => t.after(stop));
  const url = await cluster.createDatabase("tds_restart");
  const store = await openStore(url);
  t.after(() => store.close());
  const fake = await startFakeModelServer();
  t.after(() => fake.close());
  fake.setModelsBehavior("ok");
  const org = await store.createOrganization({ id: newOrganizationId(), name: "restart-org", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
  await store.grantCredits({ orgId: org.id, amountMicrousd: GRANT, nowMs: Date.now() });
  const gateway = await startGatewayProcess({ ...PAID, TDS_DATABASE_URL: url, TDS_MODEL_SERVICE_URL: fake.url });
  t.after(() => gateway.stop());
  const s: Setup = { cluster, store, gateway, orgId: org.id, key: key.raw, answers: [] };
  const pid = gateway.child.pid;

  const warmUp = await post(s, "warm-up", { warm: true });
  assert.equal(warmUp.status, 200, warmUp.body);

  for (const mode of ["fast", "immediate"] as const) {
    await t.test(`pg_ctl restart -m ${mode}`, async (st) => {
      const figures = await restartUnderLoad(s, mode);
      assertAnswers(st, s, mode, figures);
      const sweptMs = await waitForSweep(s);
      st.diagnostic(`${mode} restart: everything resolved ${sweptMs} ms after the round ended`);
      await assertBooksExact(st, s);
      const again = await post(s, `${mode}-after`, { after: mode });
      assert.equal(again.status, 200, `serves after the ${mode} restart: ${again.body}`);
      assert.equal(gateway.child.pid, pid, "the same gateway process");
    });
  }
  await assertBooksExact(t, s);
});
