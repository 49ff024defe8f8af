// Machinery: who may wake the worker or read its metrics. The database signs its wake-ups
// with the wake-up secret as Standard Webhooks says (headers webhook-id, webhook-timestamp,
// webhook-signature; checked with the `standardwebhooks` library, as Supabase's Auth Hooks
// are); the secret itself is never sent. A metrics scrape presents its token, or the service
// key, as a bearer. Anything else is refused.
import { Webhook, WebhookVerificationError } from "standardwebhooks";
import type { LogEvent } from "./log.ts";

const encoder = new TextEncoder();

async function sha256(text: string): Promise<Uint8Array> {
  return new Uint8Array(
    await crypto.subtle.digest("SHA-256", encoder.encode(text)),
  );
}

/**
 * Returns a check that tells whether an Authorization header carries one of `keys`.
 *
 * The comparison takes the same time whatever the header holds: both sides are hashed
 * first (so their lengths never differ), and every byte of every key is compared without
 * stopping early, so the time taken says nothing about how much of a key was right.
 */
export function bearerCheck(
  keys: readonly string[],
): (authorization: string | null) => Promise<boolean> {
  const digests = Promise.all(keys.map(sha256));
  return async (authorization) => {
    const match = /^Bearer +(\S+) *$/i.exec(authorization ?? "");
    const presented = await sha256(match?.[1] ?? "");
    let matches = 0;
    for (const digest of await digests) {
      let difference = 0;
      for (let i = 0; i < digest.length; i++) {
        difference |= digest[i] ^ presented[i];
      }
      matches |= Number(difference === 0);
    }
    return match !== null && matches === 1;
  };
}

/** How far a wake-up's timestamp may be from this host's clock: the library's tolerance. */
export const TOLERANCE_MS = 5 * 60 * 1000;
/**
 * The most wake-up ids remembered to refuse a replay. An id is remembered only once its
 * signature passed, so only the database adds to it: a few a second at the most.
 */
export const MAX_SEEN_IDS = 10_000;
/** A refused wake-up is logged once in this many milliseconds at most. */
export const LOG_INTERVAL_MS = 60 * 1000;

const SIGNATURE_HEADERS = ["webhook-id", "webhook-timestamp", "webhook-signature"];

/** What a wake-up check says: taken, or refused with the status to answer and why. */
export type WakeCheck = { ok: true } | { ok: false; status: 401 | 403; reason: string };

export interface WakeUpCheckOptions {
  /** The schema whose health() says where the database's secret comes from. */
  schema: string;
  log: (event: LogEvent) => void;
  /** Milliseconds since the epoch (Date.now), for forgetting old ids. */
  wallClock?: () => number;
  /** Milliseconds on a monotonic clock, for logging refusals once a minute at most. */
  monotonic?: () => number;
}

/**
 * Returns `refuse(status, reason)`, which logs a refused wake-up with what to check, once a
 * minute at most (with how many were refused in between), and returns the refusal.
 */
function refusalLog(options: WakeUpCheckOptions) {
  const monotonic = options.monotonic ?? (() => performance.now());
  let lastLogged: number | undefined;
  let unlogged = 0;
  return (status: 401 | 403, reason: string): WakeCheck => {
    const now = monotonic();
    if (lastLogged !== undefined && now - lastLogged < LOG_INTERVAL_MS) {
      unlogged++;
    } else {
      options.log({
        event: "wake.refused",
        reason,
        unlogged,
        check: "that the database signs wake-ups with this function's PGQUEUE_WAKE_SECRET " +
          `(select * from ${options.schema}.health() says where its secret comes from: a ` +
          `database setting, or the Vault secret ${options.schema}_wake_secret), and that ` +
          "this host's clock and the database's agree to within 5 minutes",
      });
      lastLogged = now;
      unlogged = 0;
    }
    return { ok: false, status, reason };
  };
}

/**
 * Returns the check of a wake-up: `signed(headers)` tells, before the body is read, whether
 * the three signature headers are there; `check(body, headers)` whether `body` was signed with
 * `secret` (a `whsec_` prefix dropped, the rest base64), at most 5 minutes off this host's
 * clock, under an id not taken before. Ids taken are remembered for as long as their
 * timestamps would pass (up to MAX_SEEN_IDS of them). A refusal is logged once a minute at
 * most, with what to check.
 */
export function wakeUpCheck(secret: string, options: WakeUpCheckOptions) {
  const webhook = new Webhook(secret);
  const wallClock = options.wallClock ?? Date.now;
  const refuse = refusalLog(options);
  const seen = new Map<string, number>(); // id -> its timestamp, in ms; in the order taken

  function signed(headers: Headers): WakeCheck {
    return SIGNATURE_HEADERS.every((name) => headers.get(name))
      ? { ok: true }
      : refuse(401, "unsigned: no webhook-id, webhook-timestamp and webhook-signature headers");
  }

  function check(body: string, headers: Headers): WakeCheck {
    const present = signed(headers);
    if (!present.ok) return present;
    try {
      webhook.verify(body, Object.fromEntries(headers), { jsonParse: false });
    } catch (error) {
      if (!(error instanceof WebhookVerificationError)) throw error;
      return refuse(403, `signature refused: ${error.message}`);
    }
    const oldest = wallClock() - TOLERANCE_MS;
    for (const [id, at] of seen) { // oldest first: ids come in about the order of their times
      if (at >= oldest) break;
      seen.delete(id);
    }
    const id = headers.get("webhook-id") ?? "";
    if (seen.has(id)) {
      return refuse(403, `replayed: webhook-id ${id.slice(0, 100)} was taken already`);
    }
    seen.set(id, 1000 * Number(headers.get("webhook-timestamp")));
    for (const oldestId of seen.keys()) {
      if (seen.size <= MAX_SEEN_IDS) break;
      seen.delete(oldestId);
    }
    return { ok: true };
  }

  return { signed, check };
}
