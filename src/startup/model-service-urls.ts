import type { Config } from "../config.ts";
import { safeUrl } from "./summary.ts";

/**
 * One warning per model service URL that was given with an API path the gateway adds itself (`…/v1`, `…/v1/systemone`):
 * the setting, the URL as given and the URL used instead (without credentials), so the operator can fix the setting.
 */
export function correctedUrlWarnings(config: Pick<Config, "modelServices">): string[] {
  return config.modelServices.flatMap((s) =>
    s.correctedFrom
      ? [
          `${s.correctedFrom.setting} is ${safeUrl(s.correctedFrom.url)}, but the gateway adds /v1/systemone and /v1/models ` +
            `itself: using ${safeUrl(s.url)}. Remove the path from ${s.correctedFrom.setting} to silence this warning.`,
        ]
      : [],
  );
}
