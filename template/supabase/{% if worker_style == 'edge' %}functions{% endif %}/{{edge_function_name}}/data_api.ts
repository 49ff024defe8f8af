// Machinery: the one way this function reaches the database. call() runs one of the queue's
// SQL functions by name with named arguments (an RPC of the Data API, PostgREST, through
// supabase-js), read() reads one of its views; both check what came back against the shape the
// caller expects before anything uses it, and fail with a QueueError that names the call.
// queue.ts (the worker's calls) and admin.ts (the rest) are written on these two.
import { createClient } from "@supabase/supabase-js";
import type { Settings } from "./settings.ts";

/** A JSON value: what payloads, results and progress are. */
export type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

/** What a call through the Data API failed with. */
export class QueueError extends Error {
  override name = "QueueError";
  constructor(
    message: string,
    /** The SQL function or view called, e.g. "enqueue()". */
    readonly call: string,
    /** The SQLSTATE, or PostgREST's PGRST code; "" when the request never got an answer. */
    readonly code: string,
    /** What the database (or the network) said, without the call, URL or hint. */
    readonly reason: string,
    /** The database's advice, if it gave any. */
    readonly hint = "",
  ) {
    super(message);
  }
}

/** The most rows the Data API returns at once (Supabase's default "max rows"). */
export const READ_LIMIT = 1000;

/** What a call must return, checked before anything uses it. */
export interface Shape<T> {
  expected: string;
  is(value: unknown): value is T;
}

export function shape<T>(expected: string, is: (value: unknown) => boolean): Shape<T> {
  return { expected, is: is as (value: unknown) => value is T };
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The kinds of JSON value a field may hold. */
const KINDS = {
  number: (value: unknown) => typeof value === "number",
  string: (value: unknown) => typeof value === "string",
  boolean: (value: unknown) => typeof value === "boolean",
  null: (value: unknown) => value === null,
  object: isRecord,
};
type Kind = keyof typeof KINDS;

/** A list of objects, each with `fields` of their kinds (other fields unchecked). */
export function rowsOf<T>(what: string, fields: Record<string, Kind | Kind[]>): Shape<T[]> {
  const fits = (value: unknown, kinds: Kind | Kind[]) =>
    [kinds].flat().some((kind) => KINDS[kind](value));
  return shape(
    `a list of ${what}`,
    (value) =>
      Array.isArray(value) &&
      value.every((row) =>
        isRecord(row) && Object.entries(fields).every(([name, kinds]) => fits(row[name], kinds))
      ),
  );
}

export const boolean = shape<boolean>("true or false", (value) => typeof value === "boolean");
export const nothing = shape<void>("nothing", () => true);

/** Where the queue lives: the settings' API URL, key (the first) and schema. */
export type QueueConnection = Pick<Settings, "supabaseUrl" | "serviceKeys" | "schema">;

export interface DataApi {
  /**
   * Calls the queue's SQL function `fn` with the named arguments `args` and returns its answer,
   * once it is `expected`. `signal` gives up on the call when it aborts (e.g.
   * AbortSignal.timeout); the call then fails with a QueueError, as any other failure does.
   */
  call<T>(
    fn: string,
    args: Record<string, unknown>,
    expected: Shape<T>,
    signal?: AbortSignal,
  ): Promise<T>;
  /**
   * Reads the `columns` of the queue's view `view`, refusing a partial answer: the Data API
   * returns at most READ_LIMIT rows at once (its "max rows" setting) and says nothing when it
   * cuts a list.
   */
  read<T>(
    view: string,
    expected: Shape<T[]>,
    options?: { columns?: string; signal?: AbortSignal },
  ): Promise<T[]>;
}

export function dataApi(connection: QueueConnection): DataApi {
  const client = createClient(connection.supabaseUrl, connection.serviceKeys[0], {
    auth: {
      persistSession: false,
      autoRefreshToken: false,
      detectSessionInUrl: false,
    },
  });
  const db = client.schema(connection.schema);

  const failure = (name: string, error: ApiError) => failed(connection, name, error);
  const checked = <T>(name: string, data: unknown, expected: Shape<T>) =>
    checkedAnswer(connection, name, data, expected);
  return {
    async call(fn, args, expected, signal) {
      const name = `${fn}()`;
      let answer;
      try {
        const request = db.rpc(fn, args);
        answer = await (signal ? request.abortSignal(signal) : request);
      } catch (error) {
        // e.g. a value JSON cannot carry (a BigInt, a cycle)
        throw failure(name, { message: String(error) });
      }
      if (answer.error) throw failure(name, answer.error);
      return checked(name, answer.data, expected);
    },

    async read(view, expected, { columns = "*", signal } = {}) {
      const request = db.from(view).select(columns).limit(READ_LIMIT);
      const { data, error } = await (signal ? request.abortSignal(signal) : request);
      if (error) throw failure(view, error);
      const rows = checked(view, data, expected);
      if (rows.length >= READ_LIMIT) {
        throw failure(view, {
          message: `${view} has ${READ_LIMIT} rows or more, the most the Data API returns at ` +
            "once: read it with SQL (or a narrower view) instead",
        });
      }
      return rows;
    },
  };
}

type ApiError = { message: string; code?: string; hint?: string };

/** How the migrations are applied, for the errors that ask for it. */
const MIGRATE = "supabase db push, or supabase migration up locally";
// No such function (PGRST202), table or view (PGRST205; 42P01, 42883 from the database): the
// queue's migrations are not all applied, or the Data API's schema cache is older than they are.
const MISSING = new Set(["PGRST202", "PGRST205", "42P01", "42883"]);
// The schema is not exposed through the Data API (PGRST106), or not there at all (3F000).
const NOT_SERVED = new Set(["PGRST106", "3F000"]);

/** What to do about an error that says the queue is not (all) in the database; or "". */
function migrationAdvice(schema: string, code = ""): string {
  if (MISSING.has(code)) {
    return ": the queue's migrations are not all applied to this database: apply them " +
      `(${MIGRATE}); if they are, reload the Data API's schema cache ` +
      "(notify pgrst, 'reload schema')";
  }
  if (NOT_SERVED.has(code)) {
    return `: the Data API does not serve the queue schema ${schema}: apply the migrations ` +
      `first (${MIGRATE}), and expose the schema: [api] schemas in supabase/config.toml ` +
      "(local), Settings > API > Exposed schemas (hosted)";
  }
  return "";
}

/** `name` is the function, e.g. "enqueue()", or the view read. */
function failed(connection: QueueConnection, name: string, error: ApiError): QueueError {
  return new QueueError(
    `${connection.schema}.${name} failed through ${connection.supabaseUrl}: ${error.message}` +
      migrationAdvice(connection.schema, error.code) +
      (error.hint ? ` (hint: ${error.hint})` : ""),
    name,
    error.code ?? "",
    error.message,
    error.hint ?? "",
  );
}

/** `data` if it has the shape `expected`, or a QueueError that says what came instead. */
function checkedAnswer<T>(
  connection: QueueConnection,
  name: string,
  data: unknown,
  expected: Shape<T>,
): T {
  if (expected.is(data)) return data;
  const got = JSON.stringify(data)?.slice(0, 200) ?? String(data);
  throw failed(connection, name, {
    message: `returned ${got}, not ${expected.expected}: are the project's migrations ` +
      `applied to this database, and is ${connection.schema} the queue's schema?`,
  });
}
