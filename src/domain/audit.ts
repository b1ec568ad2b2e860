/** What an administrative change did; one audit entry each, written in the change's own transaction. */
export type AuditAction =
  | "organization.created"
  | "organization.paused"
  | "organization.resumed"
  | "key.created"
  | "key.revoked"
  | "key.updated"
  | "key.rotated"
  | "credits.granted";

/** Who made a change: the `tds` CLI on the database, or the admin API (`client`: the caller's own label, such as "console" or "cli"). */
export interface AuditActor {
  source: "cli" | "http";
  client: string | null;
  remoteAddress: string | null;
}

export interface AuditEntry extends AuditActor {
  /** Increasing: newer entries have larger ids. */
  id: number;
  atMs: number;
  action: AuditAction;
  orgId: string;
  /** The organization's id, or the key's id for key actions. */
  targetId: string;
  /**
   * Action-specific facts, never a secret: `{name}` of the organization or key (null for a key without one),
   * `{amount_microusd, note}` of a grant (note null when none), nothing (`{}`) for a pause or resume.
   */
  details: Record<string, string | number | boolean | null>;
}
