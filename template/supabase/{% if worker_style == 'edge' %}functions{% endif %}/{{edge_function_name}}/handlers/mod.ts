// Your job kinds. Each kind has its own module in this folder and one line here: the key is
// the job's `kind` (as enqueued), the value its handler. The worker claims only these kinds.
// A kind's own backoff: `sync_crm: withBackoff(syncCrm, { base: 30, cap: 1800 })`, with
// withBackoff from ../job.ts (README.md, "Retries a handler chooses").
import type { HandlerMap } from "../job.ts";
import { sendEmail } from "./send_email.ts";
import { sendWebhook } from "./send_webhook.ts";

export const handlers = {
  send_email: sendEmail,
  send_webhook: sendWebhook,
} satisfies HandlerMap;
