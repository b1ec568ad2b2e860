/**
 * The Dockerfile, compose.yaml and the balancer's config, read as files (no container runtime runs here): a supported
 * Node.js LTS base, a non-root user, secrets only as files (*_FILE), named volumes only, gateway-2 waiting for
 * gateway-1's readiness, resource limits on every service, and one balancer in front of every gateway.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { SECRET_FILE_SETTINGS } from "../../src/config-secret-files.ts";
import { parseYamlSubset, type YamlValue } from "../support/yaml-subset.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const read = (path: string) => readFileSync(`${ROOT}${path}`, "utf8");

type Mapping = { [key: string]: YamlValue };
function mapping(value: YamlValue | undefined, what: string): Mapping {
  assert.ok(value !== null && typeof value === "object" && !Array.isArray(value), `${what} is a mapping`);
  return value as Mapping;
}
function list(value: YamlValue | undefined, what: string): string[] {
  if (value === undefined) return [];
  assert.ok(Array.isArray(value) && value.every((v) => typeof v === "string"), `${what} is a list of strings`);
  return value as string[];
}

/** Even majors from 22 on are the LTS lines (22, 24, 26, …); 20 is past its end of life. */
function assertSupportedLts(image: string): void {
  const match = /^node:(\d+)(?:[.-]|$)/.exec(image);
  assert.ok(match, `${image} is an official node image with its major version in the tag`);
  const major = Number(match[1]);
  assert.ok(major >= 22 && major % 2 === 0, `${image}: Node.js ${major} is not a supported LTS line (an even major, 22 or later)`);
}

describe("Dockerfile", () => {
  const dockerfile = read("Dockerfile");
  const instructions = dockerfile
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"));

  test("builds on a supported Node.js LTS image, in every stage", () => {
    assert.doesNotMatch(dockerfile, /node:20\b/);
    const arg = /^ARG NODE_IMAGE=(\S+)$/m.exec(dockerfile);
    assert.ok(arg, "ARG NODE_IMAGE with a default");
    assertSupportedLts(arg[1]!);
    const froms = instructions.filter((l) => /^FROM\s/i.test(l));
    assert.ok(froms.length >= 2, "a multi-stage build");
    for (const from of froms) {
      const image = from.split(/\s+/)[1]!;
      if (!/^\$\{NODE_IMAGE\}$/.test(image)) assertSupportedLts(image);
    }
  });

  test("runs as a non-root user, with /data as its volume, a liveness HEALTHCHECK and the WITH_ENGINE build arg", () => {
    const users = instructions.filter((l) => /^USER\s/.test(l)).map((l) => l.split(/\s+/)[1]!);
    assert.ok(users.length > 0, "a USER instruction");
    assert.ok(!["root", "0", "0:0"].includes(users.at(-1)!), `the last USER is ${users.at(-1)}`);
    assert.ok(instructions.includes("VOLUME /data"));
    const healthcheck = instructions.find((l) => l.startsWith("HEALTHCHECK "));
    assert.ok(healthcheck?.includes("/healthz"), "HEALTHCHECK on /healthz");
    assert.ok(instructions.some((l) => /^ARG WITH_ENGINE=true$/.test(l)));
  });

  test("bakes no secret into the image (a database URL without credentials is no secret)", () => {
    for (const line of instructions.filter((l) => /^(ENV|ARG)\s/.test(l))) {
      for (const { setting } of SECRET_FILE_SETTINGS) {
        const value = new RegExp(`\\b${setting}=(\\S*)`).exec(line)?.[1];
        if (value === undefined) continue;
        assert.ok(/_URL$/.test(setting) && !value.includes("@"), `${line} sets ${setting}`);
      }
    }
  });
});

describe("compose.yaml", () => {
  const compose = mapping(parseYamlSubset(read("compose.yaml")), "compose.yaml");
  const services = mapping(compose.services, "services");
  const topVolumes = mapping(compose.volumes, "volumes");
  const topSecrets = mapping(compose.secrets, "secrets");
  const networks = mapping(compose.networks, "networks");
  /** The services built from the Dockerfile: the gateways. */
  const gateways = Object.keys(services).filter((name) => mapping(services[name], name).build !== undefined);
  const service = (name: string) => mapping(services[name], name);

  test("runs two gateways, PostgreSQL, Redis and a balancer; no node:20", () => {
    assert.doesNotMatch(read("compose.yaml"), /node:20\b/);
    assert.deepEqual(gateways, ["gateway-1", "gateway-2"]);
    for (const name of ["balancer", "postgres", "redis"]) assert.ok(services[name], `a ${name} service`);
  });

  test("gives every secret as a file (*_FILE or POSTGRES_PASSWORD_FILE), from a secret the service mounts", () => {
    const plain = [...SECRET_FILE_SETTINGS.map((s) => s.setting), "POSTGRES_PASSWORD"];
    for (const [name, value] of Object.entries(services)) {
      const environment = mapping(mapping(value, name).environment ?? {}, `${name}.environment`);
      const mounted = list(service(name).secrets, `${name}.secrets`);
      for (const secret of plain) {
        if (secret === "TDS_REDIS_URL" && environment[secret] !== undefined) {
          assert.doesNotMatch(String(environment[secret]), /@/, `${name}: TDS_REDIS_URL holds credentials: use TDS_REDIS_URL_FILE`);
          continue;
        }
        assert.equal(environment[secret], undefined, `${name} sets ${secret} itself: use ${secret}_FILE`);
      }
      for (const [key, path] of Object.entries(environment)) {
        if (!key.endsWith("_FILE")) continue;
        const secret = /^\/run\/secrets\/([\w.-]+)$/.exec(String(path))?.[1];
        assert.ok(secret, `${name}: ${key} is /run/secrets/<name> (got ${path})`);
        assert.ok(mounted.includes(secret), `${name}: ${key} names ${secret}, which it does not mount`);
        const file = mapping(topSecrets[secret], `secrets.${secret}`).file;
        assert.match(String(file), /^\.\/deploy\/secrets\/[\w.-]+$/, `secrets.${secret} is a file in deploy/secrets/`);
      }
    }
    const gatewayEnv = mapping(service("gateway-1").environment, "gateway-1.environment");
    for (const key of ["TDS_DATABASE_URL_FILE", "TDS_METRICS_TOKEN_FILE", "TDS_ADMIN_TOKEN_FILE"]) assert.ok(gatewayEnv[key], key);
    assert.ok(mapping(service("postgres").environment, "postgres.environment").POSTGRES_PASSWORD_FILE);
  });

  test("deploy/make-secrets.sh makes every secret file; neither git nor the build context takes them", () => {
    const script = read("deploy/make-secrets.sh");
    for (const [name, value] of Object.entries(topSecrets)) {
      const file = String(mapping(value, `secrets.${name}`).file).replace("./deploy/secrets/", "");
      assert.match(script, new RegExp(`^write ${file} `, "m"), `make-secrets.sh writes ${file}`);
    }
    assert.deepEqual(
      read("deploy/secrets/.gitignore")
        .split("\n")
        .filter((l) => l && !l.startsWith("#")),
      ["*", "!.gitignore"],
    );
    assert.match(read(".dockerignore"), /^deploy$/m);
  });

  test("mounts named volumes only (and read-only files of deploy/), and one at every gateway's /data", () => {
    for (const [name, value] of Object.entries(services)) {
      for (const volume of list(mapping(value, name).volumes, `${name}.volumes`)) {
        const [source, target, mode] = volume.split(":");
        assert.ok(target !== undefined, `${name}: "${volume}" is an anonymous volume`);
        if (source!.startsWith("./deploy/") && mode === "ro") continue;
        assert.ok(source! in topVolumes, `${name}: "${volume}" is not a named volume of compose.yaml`);
      }
    }
    const sources = gateways.map((name) => {
      const data = list(service(name).volumes, `${name}.volumes`).find((v) => v.split(":")[1] === "/data");
      // Without it, the image's VOLUME /data would be an anonymous volume.
      assert.ok(data, `${name} mounts a named volume at /data`);
      return data.split(":")[0];
    });
    assert.equal(new Set(sources).size, sources.length, "each gateway has a volume of its own");
  });

  test("starts gateway-2 once gateway-1 is ready, and both once PostgreSQL and Redis are healthy", () => {
    const dependsOn = (name: string) => mapping(service(name).depends_on, `${name}.depends_on`);
    assert.equal(mapping(dependsOn("gateway-2")["gateway-1"], "gateway-1").condition, "service_healthy");
    for (const gateway of gateways) {
      for (const dependency of ["postgres", "redis"]) {
        assert.equal(mapping(dependsOn(gateway)[dependency], dependency).condition, "service_healthy", `${gateway} → ${dependency}`);
      }
      // Healthy means ready: /readyz (the database and the models), not /healthz (the process is up).
      const check = list(mapping(service(gateway).healthcheck, `${gateway}.healthcheck`).test, `${gateway}.healthcheck.test`);
      assert.match(check.join(" "), /\/readyz/);
    }
    for (const name of ["postgres", "redis", "balancer"]) assert.ok(service(name).healthcheck, `${name} has a health check`);
  });

  test("limits the CPU and memory of every service", () => {
    for (const name of Object.keys(services)) {
      const limits = mapping(
        mapping(mapping(service(name).deploy, `${name}.deploy`).resources, `${name}.deploy.resources`).limits,
        `${name}.deploy.resources.limits`,
      );
      assert.ok(limits.cpus, `${name}: a CPU limit`);
      assert.ok(limits.memory, `${name}: a memory limit`);
    }
  });

  test("publishes one port, the balancer's, which sends to every gateway; the gateways trust only its network", () => {
    const published = Object.keys(services).filter((name) => service(name).ports !== undefined);
    assert.deepEqual(published, ["balancer"]);
    assert.equal(list(service("balancer").ports, "balancer.ports").length, 1);

    const nginx = read("deploy/nginx.conf");
    const upstream = /upstream\s+gateways\s*\{([^}]*)\}/.exec(nginx)?.[1];
    assert.ok(upstream, "an upstream block");
    const servers = [...upstream.matchAll(/^\s*server\s+([\w.-]+):8080\b/gm)].map((m) => m[1]);
    assert.deepEqual(servers, gateways);
    assert.match(nginx, /proxy_pass\s+http:\/\/gateways;/);
    assert.match(nginx, /X-Forwarded-For\s+\$proxy_add_x_forwarded_for;/);
    assert.ok(
      list(service("balancer").volumes, "balancer.volumes").includes("./deploy/nginx.conf:/etc/nginx/nginx.conf:ro"),
      "the balancer runs deploy/nginx.conf",
    );

    // The trusted range is the subnet of the network the balancer shares with the gateways, and nothing else is on it.
    const trusted = new Set(gateways.map((name) => mapping(service(name).environment, name).TDS_TRUSTED_PROXIES));
    assert.equal(trusted.size, 1, "every gateway trusts the same proxies");
    const [range] = [...trusted];
    const edge = Object.entries(networks).find(([name, value]) => {
      const ipam = value === null ? undefined : mapping(value, `networks.${name}`).ipam;
      const configs = ipam === undefined ? [] : ((mapping(ipam, `networks.${name}.ipam`).config ?? []) as YamlValue[]);
      return configs.some((c) => mapping(c, `networks.${name}.ipam.config[]`).subnet === range);
    });
    assert.ok(edge, `a network whose subnet is the trusted range ${range}`);
    const onEdge = Object.keys(services).filter((name) => list(service(name).networks, `${name}.networks`).includes(edge[0]));
    assert.deepEqual(onEdge.sort(), ["balancer", ...gateways].sort());
  });
});
