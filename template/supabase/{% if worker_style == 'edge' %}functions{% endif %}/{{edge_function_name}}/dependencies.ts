// Machinery: what the jobs a job depends on ended with, as its handler reads them
// (`context.job.dependencies`). A job enqueued with `dependsOn` (a step of a Workflow,
// workflow.ts) runs once they are done; the queue hands it their kinds, statuses and results
// in its payload, under `_dependencies`, and the worker takes them out before the handler's
// schema checks the payload. A Kind names a job kind with its payload and result schemas, so
// that the code that enqueues a step and the handler that reads its result agree on them.
import type { z } from "zod";
import type { Json } from "./data_api.ts";

/** Where the queue puts them in a dependent's payload (and refuses them at enqueue). */
export const DEPENDENCIES_KEY = "_dependencies";

/**
 * A job kind, its payload and its result, each a zod schema:
 * `const THUMBNAIL = defineKind("thumbnail", Resize, Thumbnail)`. A Workflow's step of this
 * kind takes a `z.input<typeof Resize>` payload, and a dependent's handler reads its result
 * as a `z.output<typeof Thumbnail>` (`job.dependencies.results(THUMBNAIL)`).
 */
export interface Kind<Payload extends z.ZodType, Result extends z.ZodType> {
  readonly name: string;
  readonly payload: Payload;
  readonly result: Result;
}

export function defineKind<Payload extends z.ZodType, Result extends z.ZodType>(
  name: string,
  payload: Payload,
  result: Result,
): Kind<Payload, Result> {
  return Object.freeze({ name, payload, result });
}

/**
 * One job this job depended on: its kind, how it ended (`done`, or `failed` or `cancelled`
 * for a job enqueued with `onDependencyFailure: "run"`), its result (null when it returned
 * none) and, when it did not succeed, its error.
 */
export interface Dependency {
  id: number;
  kind: string;
  status: string;
  result: Json;
  error: string | null;
}

/** The jobs a job depended on; empty for a job enqueued without dependencies. */
export class Dependencies {
  /** By id, in id order. */
  readonly byId: ReadonlyMap<number, Dependency>;
  /**
   * The queue left the results out of the payload (they would have made it too large); the
   * worker fetched them with `dependency_results()` before the handler ran.
   */
  readonly resultsOmitted: boolean;

  constructor(dependencies: Iterable<Dependency> = [], resultsOmitted = false) {
    const sorted = [...dependencies].sort((a, b) => a.id - b.id);
    this.byId = new Map(sorted.map((dependency) => [dependency.id, dependency]));
    this.resultsOmitted = resultsOmitted;
  }

  get size(): number {
    return this.byId.size;
  }

  /** The dependency with this id, or undefined. */
  get(id: number): Dependency | undefined {
    return this.byId.get(id);
  }

  /** The dependencies of each kind, in id order. */
  get byKind(): Record<string, Dependency[]> {
    const kinds: Record<string, Dependency[]> = {};
    for (const dependency of this.byId.values()) (kinds[dependency.kind] ??= []).push(dependency);
    return kinds;
  }

  /** The dependencies of `kind` (a name or a Kind), in id order; [] when none. */
  ofKind(kind: string | Kind<z.ZodType, z.ZodType>): Dependency[] {
    const name = typeof kind === "string" ? kind : kind.name;
    return [...this.byId.values()].filter((dependency) => dependency.kind === name);
  }

  /** Those that did not succeed (only a job enqueued with "run" sees any). */
  get failed(): Dependency[] {
    return [...this.byId.values()].filter((dependency) => dependency.status !== "done");
  }

  /**
   * The results of the done dependencies of `kind`, in id order, checked by its result schema
   * (a ZodError when one does not fit).
   */
  results<Result extends z.ZodType>(kind: Kind<z.ZodType, Result>): z.output<Result>[] {
    return this.ofKind(kind)
      .filter((dependency) => dependency.status === "done")
      .map((dependency) => kind.result.parse(dependency.result));
  }

  /** The result of the one done dependency of `kind`; an Error when there is none or more. */
  result<Result extends z.ZodType>(kind: Kind<z.ZodType, Result>): z.output<Result> {
    const found = this.results(kind);
    if (found.length !== 1) {
      const all = [...this.byId.values()].map((d) => `#${d.id} ${d.kind} ${d.status}`);
      throw new Error(
        `${found.length} done dependencies of kind "${kind.name}", not one (the job depends ` +
          `on: ${all.join(", ") || "nothing"}): use results() for a list`,
      );
    }
    return found[0];
  }
}

export const NO_DEPENDENCIES = new Dependencies();

/**
 * The payload without `_dependencies`, and the dependencies it held (NO_DEPENDENCIES for a
 * payload without them). An Error when they are not in the queue's shape: an object keyed by
 * job id of {kind, status, result, error}; where the queue left the results out, its entries
 * say `"results_omitted": true`.
 */
export function takeDependencies(
  payload: unknown,
): { payload: unknown; dependencies: Dependencies } {
  if (!isObject(payload) || !Object.hasOwn(payload, DEPENDENCIES_KEY)) {
    return { payload, dependencies: NO_DEPENDENCIES };
  }
  const { [DEPENDENCIES_KEY]: given, ...rest } = payload;
  if (!isObject(given)) {
    throw new Error(
      `${DEPENDENCIES_KEY} must be an object keyed by job id, got ${JSON.stringify(given)}`,
    );
  }
  const { results_omitted: omittedAll, ...entries } = given;
  const found = Object.entries(entries).map(([key, entry]) => toDependency(key, entry));
  const omitted = omittedAll === true ||
    Object.values(entries).some((entry) => isObject(entry) && entry.results_omitted === true);
  return { payload: rest, dependencies: new Dependencies(found, omitted) };
}

/** The rows of `dependency_results(job_id)`: id, kind, status, result, error. */
export function dependenciesFromRows(rows: readonly unknown[], resultsOmitted = false) {
  return new Dependencies(
    rows.map((row) => toDependency(isObject(row) ? row.id : row, row)),
    resultsOmitted,
  );
}

function toDependency(key: unknown, entry: unknown): Dependency {
  const id = typeof key === "number" ? key : Number(key);
  if (
    !Number.isSafeInteger(id) || typeof key === "string" && !/^\d+$/.test(key) ||
    !isObject(entry) || typeof entry.kind !== "string" || typeof entry.status !== "string"
  ) {
    throw new Error(
      `${DEPENDENCIES_KEY}[${JSON.stringify(key)}] is not a job id with its kind and status: ` +
        JSON.stringify(entry),
    );
  }
  const error = typeof entry.error === "string" ? entry.error : null;
  return {
    id,
    kind: entry.kind,
    status: entry.status,
    result: (entry.result ?? null) as Json,
    error,
  };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
