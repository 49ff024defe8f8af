// send_webhook: POST a JSON body to a URL, e.g. to tell another service that something
// happened. A network error or a 5xx is retried with backoff; a 4xx will not get better, so
// the job goes to the dead letters at once. The receiver gets an Idempotency-Key header that
// stays the same across retries of one job, so it can ignore repeats.
import { z } from "zod";
import { defineHandler, PermanentError } from "../job.ts";

export const SendWebhookPayload = z.object({
  url: z.url({ protocol: /^https?$/ }),
  body: z.json().default(null),
  headers: z.record(z.string(), z.string()).default({}),
});

export type SendWebhookPayload = z.infer<typeof SendWebhookPayload>;

/** Status codes that say "try again later" even though they are 4xx. */
const RETRYABLE_4XX = new Set([408, 425, 429]);

export const sendWebhook = defineHandler(
  SendWebhookPayload,
  async ({ url, body, headers }, { job, signal }) => {
    const response = await fetch(url, {
      method: "POST",
      headers: {
        "Content-Type": "application/json",
        "Idempotency-Key": `${job.kind}-${job.id}`,
        ...headers,
      },
      body: JSON.stringify(body),
      signal,
    });
    await response.body?.cancel();
    if (response.ok) return;
    const message = `POST ${url} answered ${response.status} ${response.statusText}`;
    if (response.status < 500 && !RETRYABLE_4XX.has(response.status)) {
      throw new PermanentError(message);
    }
    throw new Error(message);
  },
);
