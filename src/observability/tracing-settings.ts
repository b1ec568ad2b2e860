import { ConfigError } from "../config.ts";

/** The OpenTelemetry trace export the standard OTEL_* variables ask for; null from tracingSettings: tracing is off. */
export interface TracingSettings {
  /** Where spans are POSTed (OTLP/HTTP): OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, or OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces. */
  url: string;
  protocol: "http/protobuf" | "http/json";
  /** service.name, service.version and OTEL_RESOURCE_ATTRIBUTES. */
  resource: Record<string, string>;
  sampler: { name: SamplerName; ratio: number };
}

export const SAMPLERS = [
  "always_on",
  "always_off",
  "traceidratio",
  "parentbased_always_on",
  "parentbased_always_off",
  "parentbased_traceidratio",
] as const;
export type SamplerName = (typeof SAMPLERS)[number];

export const DEFAULT_TRACING_SERVICE_NAME = "typed-decision-service";

type Env = Record<string, string | undefined>;

const value = (raw: string | undefined): string | null => {
  const trimmed = raw?.trim() ?? "";
  return trimmed === "" ? null : trimmed;
};

/**
 * Tracing from the standard variables: off (null) without OTEL_EXPORTER_OTLP_ENDPOINT or
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, with OTEL_TRACES_EXPORTER=none or with OTEL_SDK_DISABLED=true. A value this
 * gateway cannot honour (the grpc protocol, another exporter or sampler, a ratio outside 0…1) is a ConfigError.
 */
export function tracingSettings(env: Env, serviceVersion: string): TracingSettings | null {
  if (value(env.OTEL_SDK_DISABLED)?.toLowerCase() === "true") return null;
  const exporters = (value(env.OTEL_TRACES_EXPORTER) ?? "otlp").split(",").map((e) => e.trim().toLowerCase());
  if (exporters.includes("none")) return null;
  const tracesEndpoint = value(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
  const endpoint = value(env.OTEL_EXPORTER_OTLP_ENDPOINT);
  if (tracesEndpoint === null && endpoint === null) return null;

  const problems: string[] = [];
  const others = exporters.filter((e) => e !== "otlp");
  if (others.length > 0)
    problems.push(`OTEL_TRACES_EXPORTER: only "otlp" (or "none") is supported; got ${JSON.stringify(others.join(","))}`);

  const url = tracesEndpoint ?? `${endpoint!.replace(/\/+$/, "")}/v1/traces`;
  const which = tracesEndpoint !== null ? "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" : "OTEL_EXPORTER_OTLP_ENDPOINT";
  if (!/^https?:\/\/[^/]/i.test(url) || !URL.canParse(url)) problems.push(`${which}: must be an http(s) URL; got ${JSON.stringify(url)}`);

  const protocolVar =
    value(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) !== null ? "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" : "OTEL_EXPORTER_OTLP_PROTOCOL";
  const protocol = value(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) ?? value(env.OTEL_EXPORTER_OTLP_PROTOCOL) ?? "http/protobuf";
  if (protocol === "grpc")
    problems.push(
      `${protocolVar}: grpc is not supported; use http/protobuf or http/json (an OpenTelemetry Collector takes both on port 4318)`,
    );
  else if (protocol !== "http/protobuf" && protocol !== "http/json")
    problems.push(`${protocolVar}: must be http/protobuf or http/json; got ${JSON.stringify(protocol)}`);

  const samplerName = (value(env.OTEL_TRACES_SAMPLER) ?? "parentbased_always_on").toLowerCase();
  if (!(SAMPLERS as readonly string[]).includes(samplerName))
    problems.push(`OTEL_TRACES_SAMPLER: must be one of ${SAMPLERS.join(", ")}; got ${JSON.stringify(samplerName)}`);
  let ratio = 1;
  const arg = value(env.OTEL_TRACES_SAMPLER_ARG);
  if (arg !== null && samplerName.endsWith("traceidratio")) {
    ratio = Number(arg);
    if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1)
      problems.push(`OTEL_TRACES_SAMPLER_ARG: the sampling ratio must be a number from 0 to 1; got ${JSON.stringify(arg)}`);
  }

  const resource: Record<string, string> = { "service.version": serviceVersion };
  const attributes = value(env.OTEL_RESOURCE_ATTRIBUTES);
  if (attributes !== null) {
    for (const pair of attributes.split(",")) {
      if (pair.trim() === "") continue;
      const eq = pair.indexOf("=");
      const key = eq < 0 ? "" : pair.slice(0, eq).trim();
      if (key === "") {
        problems.push(`OTEL_RESOURCE_ATTRIBUTES: each entry must be key=value; got ${JSON.stringify(pair)}`);
        continue;
      }
      try {
        resource[decodeURIComponent(key)] = decodeURIComponent(pair.slice(eq + 1).trim());
      } catch {
        problems.push(`OTEL_RESOURCE_ATTRIBUTES: ${JSON.stringify(pair)} is not percent-encoded correctly`);
      }
    }
  }
  resource["service.name"] = value(env.OTEL_SERVICE_NAME) ?? resource["service.name"] ?? DEFAULT_TRACING_SERVICE_NAME;

  if (problems.length > 0) throw new ConfigError(problems);
  return { url, protocol: protocol as TracingSettings["protocol"], resource, sampler: { name: samplerName as SamplerName, ratio } };
}
