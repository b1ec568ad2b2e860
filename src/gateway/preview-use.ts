import { msUntilUtcMidnight, utcDay } from "../domain/utc-day.ts";
import type { BookkeepingStore } from "../store/store.ts";

/** An organization's preview requests of today (UTC) against its daily limit. */
export interface PreviewUse {
  day: string;
  used: number;
  limit: number;
  /** The next 00:00 UTC, when the count starts again. */
  resetsAtMs: number;
}

/** Today's preview use of one organization, as GET /v1/organization and the administration show it. */
export async function previewUse(
  store: Pick<BookkeepingStore, "previewCount">,
  query: { orgId: string; limit: number; nowMs: number },
): Promise<PreviewUse> {
  const day = utcDay(query.nowMs);
  const used = await store.previewCount(query.orgId, day);
  return { day, used, limit: query.limit, resetsAtMs: query.nowMs + msUntilUtcMidnight(query.nowMs) };
}
