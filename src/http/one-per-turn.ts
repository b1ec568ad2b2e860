/**
 * Runs jobs one per turn of the event loop, in the order they came: between two jobs, the sockets are served (a
 * /healthz request waits for one job at most, not for every job that became ready at the same moment).
 */
export function createOnePerTurn(): (job: () => void) => void {
  const jobs: Array<() => void> = [];
  let head = 0;
  let scheduled = false;
  const runOne = () => {
    const job = jobs[head]!;
    jobs[head++] = noop;
    if (head === jobs.length) {
      jobs.length = 0;
      head = 0;
    }
    // A callback scheduled while the immediates run waits for the next turn, after the sockets are polled.
    scheduled = jobs.length > 0;
    if (scheduled) setImmediate(runOne);
    job();
  };
  return (job) => {
    jobs.push(job);
    if (scheduled) return;
    scheduled = true;
    setImmediate(runOne);
  };
}

function noop(): void {}
