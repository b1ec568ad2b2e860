import { MemoryRateLimiter } from "../../src/limits/memory-rate-limiter.ts";
import { describeRateLimiterContract } from "./rate-limiter-contract.ts";

// The shared contract on a FixedClock: every assertion of the sliding log is exact here
// (the 3-in-30 s scenario, the 200-run property, the lowered limit, concurrent calls).
describeRateLimiterContract("MemoryRateLimiter (sliding log)", async (clock) => new MemoryRateLimiter(clock));
