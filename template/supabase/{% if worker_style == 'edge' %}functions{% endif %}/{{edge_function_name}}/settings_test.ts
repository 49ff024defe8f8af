import assert from "node:assert/strict";
import { loadSettings, SettingsError } from "./settings.ts";

const base = {
  SUPABASE_URL: "http://127.0.0.1:54321",
  SUPABASE_SERVICE_ROLE_KEY: "service-role-jwt",
  PGQUEUE_WAKE_SECRET: `whsec_${btoa("wake-secret-of-the-tests")}`,
};

function env(values: Record<string, string>) {
  return (name: string) => values[name];
}

Deno.test("the Edge runtime's variables are enough", () => {
  const settings = loadSettings(env(base));
  assert.equal(settings.supabaseUrl, base.SUPABASE_URL);
  assert.deepEqual(settings.serviceKeys, ["service-role-jwt"]);
  assert.ok(settings.timeBudgetMs < 150_000, "must stop before the free plan's 150 s limit");
  assert.ok(settings.batchSize >= 1);
  assert.equal(settings.leaseSeconds, 60, "short leases, renewed while the jobs run");
  assert.equal(settings.lingerMs, 2000);
  assert.equal(settings.lingerPollMs, 100);
  assert.ok(settings.lingerMs < settings.timeBudgetMs);
  assert.deepEqual(
    [settings.cpuSoftLimitMs, settings.cpuHardLimitMs, settings.cpuHeavyKinds],
    [1000, 2000, []],
    "the Edge runtime's default CPU limits; no kind declared CPU-heavy",
  );
  assert.equal(settings.cpuHeavyPerIsolate, 1);
  assert.equal(settings.logLevel, "info");
});

Deno.test("the CPU limits, the CPU-heavy kinds and the log level are read", () => {
  const settings = loadSettings(env({
    ...base,
    PGQUEUE_CPU_SOFT_LIMIT_MS: "400",
    PGQUEUE_CPU_HARD_LIMIT_MS: "500",
    PGQUEUE_CPU_HEAVY_KINDS: "resize_image, render_pdf",
    PGQUEUE_CPU_HEAVY_PER_ISOLATE: "2",
    PGQUEUE_LOG_LEVEL: "debug",
  }));
  assert.deepEqual(
    [settings.cpuSoftLimitMs, settings.cpuHardLimitMs, settings.cpuHeavyKinds],
    [400, 500, ["resize_image", "render_pdf"]],
  );
  assert.equal(settings.cpuHeavyPerIsolate, 2);
  assert.equal(settings.logLevel, "debug");
  assert.throws(
    () =>
      loadSettings(env({
        ...base,
        PGQUEUE_CPU_SOFT_LIMIT_MS: "3000",
        PGQUEUE_CPU_HARD_LIMIT_MS: "2000",
      })),
    /PGQUEUE_CPU_HARD_LIMIT_MS \(2000\) is below PGQUEUE_CPU_SOFT_LIMIT_MS \(3000\)/,
  );
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_LOG_LEVEL: "verbose" })),
    /PGQUEUE_LOG_LEVEL must be "info" .* or "debug"/,
  );
});

Deno.test("a worker key and the new secret keys come before the legacy key", () => {
  const settings = loadSettings(env({
    ...base,
    PGQUEUE_SERVICE_KEY: "custom",
    SUPABASE_SECRET_KEYS: JSON.stringify({ default: "sb_secret_a", other: "sb_secret_b" }),
  }));
  assert.deepEqual(settings.serviceKeys, [
    "custom",
    "sb_secret_a",
    "sb_secret_b",
    "service-role-jwt",
  ]);
});

Deno.test("numbers and the schema are read from the environment", () => {
  const settings = loadSettings(env({
    ...base,
    PGQUEUE_SCHEMA: "jobs",
    PGQUEUE_BATCH_SIZE: "25",
    PGQUEUE_LEASE_SECONDS: "60",
    PGQUEUE_TIME_BUDGET_SECONDS: "30",
    PGQUEUE_LINGER_MS: "500",
    PGQUEUE_LINGER_POLL_MS: "50",
  }));
  assert.equal(settings.schema, "jobs");
  assert.equal(settings.batchSize, 25);
  assert.equal(settings.leaseSeconds, 60);
  assert.equal(settings.timeBudgetMs, 30_000);
  assert.equal(settings.lingerMs, 500);
  assert.equal(settings.lingerPollMs, 50);
});

Deno.test("PGQUEUE_LINGER_MS=0 turns the linger off; an empty lease is the default", () => {
  const settings = loadSettings(
    env({ ...base, PGQUEUE_LINGER_MS: "0", PGQUEUE_LEASE_SECONDS: "" }),
  );
  assert.equal(settings.lingerMs, 0);
  assert.equal(settings.leaseSeconds, 60);
});

Deno.test("errors name the variable and what to do", () => {
  assert.throws(() => loadSettings(env({})), (error: Error) => {
    assert.ok(error instanceof SettingsError);
    assert.match(error.message, /SUPABASE_URL is not set/);
    return true;
  });
  assert.throws(
    () => loadSettings(env({ SUPABASE_URL: base.SUPABASE_URL })),
    /SUPABASE_SERVICE_ROLE_KEY/,
  );
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_BATCH_SIZE: "ten" })),
    /PGQUEUE_BATCH_SIZE must be a whole number from 1 to 1000; got "ten"/,
  );
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_LEASE_SECONDS: "5" })),
    /PGQUEUE_LEASE_SECONDS must be a whole number from 10 to 400; got "5"/,
  );
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_LINGER_MS: "-1" })),
    /PGQUEUE_LINGER_MS must be a whole number from 0 to 60000; got "-1"/,
  );
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_SCHEMA: "bad-name" })),
    /PGQUEUE_SCHEMA must be a plain schema name/,
  );
  assert.throws(
    () => loadSettings(env({ ...base, SUPABASE_SECRET_KEYS: "sb_secret_x" })),
    /SUPABASE_SECRET_KEYS must be a JSON object/,
  );
});

Deno.test("the wake-up secret is required and never an API key", () => {
  const { PGQUEUE_WAKE_SECRET: _, ...without } = base;
  assert.throws(() => loadSettings(env(without)), /PGQUEUE_WAKE_SECRET is not set/);
  for (const key of ["eyJhbGciOiJIUzI1NiJ9.e30.x", "sb_secret_abc", "service-role-jwt"]) {
    assert.throws(
      () => loadSettings(env({ ...base, PGQUEUE_WAKE_SECRET: key })),
      /must not be a Supabase API key/,
    );
  }
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_WAKE_SECRET: "short" })),
    /at least 16 characters/,
  );
  // signed with as Standard Webhooks reads a secret: base64, maybe after whsec_
  for (
    const unreadable of [
      "wake-secret-of-the-tests",
      "whsec_not base64 at all!",
      "0123456789abcdefa",
    ]
  ) {
    assert.throws(
      () => loadSettings(env({ ...base, PGQUEUE_WAKE_SECRET: unreadable })),
      /PGQUEUE_WAKE_SECRET must be base64/,
    );
  }
  const hex = "0123456789abcdef".repeat(4); // as `openssl rand -hex 32` makes one
  assert.equal(loadSettings(env({ ...base, PGQUEUE_WAKE_SECRET: hex })).wakeSecret, hex);
  assert.equal(loadSettings(env(base)).wakeSecret, base.PGQUEUE_WAKE_SECRET);
});

Deno.test("the start-up errors tell the service key from the wake-up secret, and where to set it", () => {
  const { PGQUEUE_WAKE_SECRET: _, ...without } = base;
  assert.throws(
    () => loadSettings(env(without)),
    (error: Error) =>
      error.message.includes("checks the database's wake-ups") &&
      error.message.includes("supabase secrets set PGQUEUE_WAKE_SECRET=") &&
      error.message.includes("supabase functions serve --env-file"),
  );
  const { SUPABASE_SERVICE_ROLE_KEY: __, ...keyless } = base;
  assert.throws(
    () => loadSettings(env(keyless)),
    (error: Error) =>
      error.message.includes("PGQUEUE_SERVICE_KEY") &&
      error.message.includes("wake-ups are checked with another secret, PGQUEUE_WAKE_SECRET") &&
      !error.message.includes("the key the database sends"),
  );
});

Deno.test("the wall-clock limit is the free plan's 150 s unless set, and bounds the budget", () => {
  const free = loadSettings(env(base));
  assert.equal(free.wallClockLimitMs, 150_000);
  assert.ok(free.timeBudgetMs <= free.wallClockLimitMs);
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_TIME_BUDGET_SECONDS: "200" })),
    (error: Error) => {
      assert.ok(error instanceof SettingsError);
      assert.match(
        error.message,
        /PGQUEUE_TIME_BUDGET_SECONDS is 200, above the plan's wall-clock limit of 150 s.*PGQUEUE_WALL_CLOCK_LIMIT_SECONDS=400/,
      );
      return true;
    },
  );
  const paid = loadSettings(
    env({ ...base, PGQUEUE_WALL_CLOCK_LIMIT_SECONDS: "400", PGQUEUE_TIME_BUDGET_SECONDS: "200" }),
  );
  assert.deepEqual([paid.wallClockLimitMs, paid.timeBudgetMs], [400_000, 200_000]);
  // Scaled down (tests): the default budget never exceeds the limit.
  const short = loadSettings(env({ ...base, PGQUEUE_WALL_CLOCK_LIMIT_SECONDS: "20" }));
  assert.deepEqual([short.wallClockLimitMs, short.timeBudgetMs], [20_000, 20_000]);
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_WALL_CLOCK_LIMIT_SECONDS: "401" })),
    /PGQUEUE_WALL_CLOCK_LIMIT_SECONDS must be a whole number from 2 to 400/,
  );
});

Deno.test("the cap on jobs in flight is one batch unless set, and a batch never exceeds it", () => {
  assert.equal(loadSettings(env(base)).maxJobsInFlight, 10);
  assert.equal(loadSettings(env({ ...base, PGQUEUE_BATCH_SIZE: "25" })).maxJobsInFlight, 25);
  const capped = loadSettings(
    env({ ...base, PGQUEUE_MAX_JOBS_IN_FLIGHT: "4", PGQUEUE_BATCH_SIZE: "25" }),
  );
  assert.deepEqual([capped.maxJobsInFlight, capped.batchSize], [4, 4]);
});

Deno.test("the metrics token is optional, and never an API key or the wake-up secret", () => {
  assert.equal(loadSettings(env(base)).metricsToken, undefined);
  const token = ["metrics", "token", "of", "the", "tests"].join("-");
  assert.equal(
    loadSettings(env({ ...base, PGQUEUE_METRICS_TOKEN: token })).metricsToken,
    token,
  );
  for (const reused of ["sb_secret_abc", "service-role-jwt", base.PGQUEUE_WAKE_SECRET]) {
    assert.throws(
      () => loadSettings(env({ ...base, PGQUEUE_METRICS_TOKEN: reused })),
      /PGQUEUE_METRICS_TOKEN must be a token of its own/,
    );
  }
  assert.throws(
    () => loadSettings(env({ ...base, PGQUEUE_METRICS_TOKEN: "short" })),
    /PGQUEUE_METRICS_TOKEN must be at least 16 characters/,
  );
});
