import { Type } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { balanceJson } from "../../../admin/admin-json.ts";
import { AdminBalance, GrantCreditsBody, OrgParams } from "../../../contract/admin.ts";
import { IdempotencyKeyHeader } from "../../../contract/headers.ts";
import { ServiceError } from "../../../domain/errors.ts";
import { parseUsd } from "../../../domain/money.ts";
import { type AdminContext, errors, security } from "./admin-context.ts";

const GrantHeaders = Type.Object({
  "x-tds-client": Type.Optional(Type.String({ maxLength: 50 })),
  "idempotency-key": IdempotencyKeyHeader(
    "The same key with the same grant within 24 h answers the first grant's balance (Idempotent-Replayed: true) and grants nothing again",
  ),
});

/** `amount_usd` of a grant in microUSD: a decimal USD amount above 0, or a 422 invalid_body naming the field. */
function grantAmount(text: string): number {
  const amount = text === text.trim() ? parseUsd(text) : null;
  const problem =
    amount === null ? "must be a decimal USD amount such as 12.50 (at most 6 decimals)" : amount <= 0n ? "must be more than 0" : null;
  if (problem !== null)
    throw new ServiceError("invalid_body", `Invalid request body: amount_usd: ${problem}`, {
      errors: [{ field: "amount_usd", message: problem }],
    });
  return Number(amount);
}

/** Credits: grants, at most once per Idempotency-Key. */
export function adminCreditRoutes(app: FastifyInstance, { route, admin }: AdminContext): void {
  app.post<{ Params: OrgParams; Body: GrantCreditsBody; Headers: { "x-tds-client"?: string; "idempotency-key"?: string } }>(
    "/admin/v1/organizations/:org/credits",
    {
      ...route,
      schema: {
        operationId: "adminGrantCredits",
        summary: "Grant credits; answers the new balance. With Idempotency-Key, a retried grant is applied once",
        security,
        params: OrgParams,
        headers: GrantHeaders,
        body: GrantCreditsBody,
        response: { 200: AdminBalance, ...errors },
      },
    },
    async (request, reply) => {
      const amountMicrousd = grantAmount(request.body.amount_usd);
      const key = request.headers["idempotency-key"];
      const { org, balance, replayed } = await admin(request).grantCredits(request.params.org, {
        amountMicrousd,
        ...(request.body.note !== undefined ? { note: request.body.note } : {}),
        ...(key !== undefined ? { idempotencyKey: key } : {}),
      });
      if (replayed) reply.header("idempotent-replayed", "true");
      return balanceJson(org.id, balance);
    },
  );
}
