// send_email: a stub to replace with your email provider's API (Resend, Postmark, SES, ...).
// It checks the payload and logs the message it would send, without the address.
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
  ({ subject, text }, { job }) => {
    console.log(JSON.stringify({
      event: "send_email.stub",
      id: job.id,
      subject,
      characters: text.length,
    }));
  },
);
