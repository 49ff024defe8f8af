// send_email: a stub to replace with your email provider's API (Resend, Postmark, SES, ...).
// It checks the payload and sends nothing. It logs nothing either: the Edge runtime keeps at
// most 100 log lines per 10 s, so a line per job would crowd out the worker's own (README.md,
// "Logs"); when you call your provider, return its message id to keep it as the job's result.
import { z } from "zod";
import { defineHandler } from "../job.ts";

export const SendEmailPayload = z.object({
  to: z.email(),
  subject: z.string().min(1).max(998),
  text: z.string(),
});

export type SendEmailPayload = z.infer<typeof SendEmailPayload>;

export const sendEmail = defineHandler(
  SendEmailPayload,
  (_email, _context) => {
    // e.g. const { id } = await resend.emails.send({ from, to, subject, text });
    //      return { messageId: id };
  },
);
