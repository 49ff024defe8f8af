// Test helper for tests against a database (db_tests/; not exported by testing.ts, as it
// loads a Postgres driver that only those tests need): the queue's clock, moved for a test.
//
//   await queueClock(queue).advance(300); // a job due in 5 minutes is due now
//
// The queue reads the database's now(), which a test cannot stop or set. What it can do is
// bring the queued jobs' run_after back, which is what a retry's backoff or a job enqueued for
// later waits on. It is a plain UPDATE of the queue's tables on a direct connection to the
// test database (DATABASE_URL, or DB_URL as `supabase status -o env` prints it), no change to
// the queue's SQL, and for tests only. Running jobs keep their leases.
import postgres from "postgres";
import { DEFAULT_SCHEMA, type Env } from "./settings.ts";
import { STACK_HINT, StackMissing } from "./testing_drain.ts";

export interface QueueClock {
  /** Makes the queued jobs of the queue due `seconds` sooner; how many moved. */
  advance(seconds: number): Promise<number>;
  /** Enqueues the job of `schedule` for its current slot now, as pg_cron would; its id. */
  fire(schedule: string): Promise<number>;
}

export interface QueueClockOptions {
  /** A direct connection to the test database (default: DATABASE_URL, or DB_URL). */
  databaseUrl?: string;
  /** The queue's schema (default: PGQUEUE_SCHEMA, or the project's). */
  schema?: string;
}

/** DATABASE_URL, or DB_URL; StackMissing when neither is set. */
export function testDatabaseUrl(env: Env = (name) => Deno.env.get(name)): string {
  const url = env("DATABASE_URL") || env("DB_URL");
  if (!url) {
    throw new StackMissing(
      "queueClock needs a direct connection to the test database: DATABASE_URL and DB_URL " +
        `are not set: ${STACK_HINT}`,
    );
  }
  return url;
}

/** The clock of `queue` (see the top of this file). */
export function queueClock(queue: string, options: QueueClockOptions = {}): QueueClock {
  const url = options.databaseUrl ?? testDatabaseUrl();
  const schema = options.schema ?? (Deno.env.get("PGQUEUE_SCHEMA") || DEFAULT_SCHEMA);
  // One connection per call, closed after it: nothing is left open when a test ends.
  const connected = async <T>(work: (sql: postgres.Sql) => Promise<T>): Promise<T> => {
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    try {
      return await work(sql);
    } finally {
      await sql.end();
    }
  };
  return {
    advance: (seconds) => {
      if (!Number.isFinite(seconds) || seconds < 0) {
        return Promise.reject(
          new RangeError(`the queue's clock only goes forward: advance(${seconds})`),
        );
      }
      return connected((sql) =>
        sql.begin(async (tx) => {
          const jobs = await tx`
            update ${tx(schema)}.jobs set run_after = run_after - make_interval(secs => ${seconds})
            where queue = ${queue} and status = 'queued'`;
          // a batch of jobs enqueued together is due at once: its queued ones all move
          const [batches] = await tx`
            with moved as (
              update ${
            tx(schema)
          }.job_batches set run_after = run_after - make_interval(secs => ${seconds})
              where queue = ${queue} returning size - taken as jobs)
            select coalesce(sum(jobs), 0)::integer as jobs from moved`;
          return jobs.count + (batches.jobs as number);
        })
      );
    },
    fire: (schedule) =>
      connected(async (sql) => {
        const [row] = await sql`select ${sql(schema)}.enqueue_scheduled(${schedule}) as id`;
        if (row?.id === null || row?.id === undefined) {
          throw new Error(`no schedule named "${schedule}": define it with queue.schedule()`);
        }
        return Number(row.id);
      }),
  };
}
