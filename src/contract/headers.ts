import { Type } from "@sinclair/typebox";

/** The Idempotency-Key header of the routes that take one: printable ASCII without spaces, 1 to 255 characters. */
export function IdempotencyKeyHeader(description: string) {
  return Type.Optional(Type.String({ minLength: 1, maxLength: 255, pattern: "^[\\x21-\\x7E]+$", description }));
}
