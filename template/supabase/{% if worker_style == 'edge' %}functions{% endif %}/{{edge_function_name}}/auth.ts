// Machinery: who may wake the worker or read its metrics. The database's wake-ups carry
// `Authorization: Bearer <wake-up secret>`; a metrics scrape, the service key. Anything else
// is refused.

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
