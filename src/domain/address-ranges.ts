import { BlockList, isIP } from "node:net";

/** The names accepted besides addresses and CIDR ranges (the same sets as Express's and Fastify's trust proxy). */
const NAMED_RANGES: Record<string, [network: string, prefix: number][]> = {
  loopback: [
    ["127.0.0.0", 8],
    ["::1", 128],
  ],
  linklocal: [
    ["169.254.0.0", 16],
    ["fe80::", 10],
  ],
  uniquelocal: [
    ["10.0.0.0", 8],
    ["172.16.0.0", 12],
    ["192.168.0.0", 16],
    ["fc00::", 7],
  ],
};

/** A set of IP addresses; IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) match their IPv4 ranges. */
export interface AddressRanges {
  readonly size: number;
  has(address: string): boolean;
}

function parse(entry: string): [network: string, prefix: number][] | string {
  const text = entry.trim();
  const named = NAMED_RANGES[text.toLowerCase()];
  if (named) return named;
  const [network = "", prefixText, ...rest] = text.split("/");
  const family = isIP(network);
  if (family === 0 || rest.length > 0)
    return "is neither an IP address, a CIDR range (10.0.0.0/8, fd00::/8) nor loopback, linklocal or uniquelocal";
  const max = family === 4 ? 32 : 128;
  if (prefixText === undefined) return [[network, max]];
  const prefix = Number(prefixText);
  if (!/^[0-9]{1,3}$/.test(prefixText) || prefix > max) return `has a prefix length that is not 0 to ${max}`;
  return [[network, prefix]];
}

/** Why one entry (an address, a CIDR range or loopback / linklocal / uniquelocal) cannot be read; null when it can. */
export function addressRangeProblem(entry: string): string | null {
  const parsed = parse(entry);
  return typeof parsed === "string" ? parsed : null;
}

/** The set of the entries; throws on one that addressRangeProblem refuses. */
export function addressRanges(entries: readonly string[]): AddressRanges {
  const list = new BlockList();
  for (const entry of entries) {
    const parsed = parse(entry);
    if (typeof parsed === "string") throw new Error(`${JSON.stringify(entry)} ${parsed}`);
    for (const [network, prefix] of parsed) list.addSubnet(network, prefix, isIP(network) === 4 ? "ipv4" : "ipv6");
  }
  return {
    size: entries.length,
    has: (address) => {
      const family = isIP(address);
      return family !== 0 && list.check(address, family === 4 ? "ipv4" : "ipv6");
    },
  };
}
