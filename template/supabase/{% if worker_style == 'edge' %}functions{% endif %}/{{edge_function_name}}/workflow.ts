// Machinery: a workflow, steps (jobs) that each run once the steps they depend on are done,
// enqueued together in one enqueue_many() call, so in one transaction: all of them, or none.
//
//   const workflow = new Workflow();
//   const photo = workflow.step(FETCH, { url });
//   const small = workflow.step(RESIZE, { width: 64 }, { after: [photo] });
//   const large = workflow.step(RESIZE, { width: 1024 }, { after: [photo] });
//   const album = workflow.step(ALBUM, { name: "summer" }, { after: [small, large] });
//   await workflow.enqueue(supabaseQueue(loadSettings()));
//   console.log(album.id);
//
// Each step's handler reads what its dependencies returned in `context.job.dependencies`
// (dependencies.ts). A step may also depend on a job enqueued before, by its id
// (`after: [42]`). A dependency dead-lettered or cancelled cancels the steps that wait on it,
// transitively, unless a step says `onDependencyFailure: "run"`. From SQL, in your own
// transaction: `select * from <schema>.enqueue_many($1)` with `workflow.jobs()` as $1, then
// `workflow.enqueued(ids)`.
import type { z } from "zod";
import { DEPENDENCIES_KEY, type Kind } from "./dependencies.ts";
import type { Json } from "./data_api.ts";
import { type NewJob, newJobArgs, type OnDependencyFailure } from "./admin.ts";

/** How a step runs: NewJob's options, and what it waits for. */
export interface StepOptions
  extends Omit<NewJob, "kind" | "payload" | "dependsOn" | "dependsOnIndex"> {
  /** Steps of this workflow, steps of one enqueued before, and ids of jobs enqueued before. */
  after?: readonly (Step<unknown> | number)[];
  /** When a dependency is dead-lettered or cancelled: "cancel" this step (default) or "run" it. */
  onDependencyFailure?: OnDependencyFailure;
}

/** A step of a Workflow: its place, its kind and, once enqueued, its job's id. */
export class Step<Result> {
  #id: number | undefined;
  /** Its result's type, for the dependents that read it (never set: a type only). */
  declare readonly result?: Result;

  constructor(
    readonly workflow: Workflow,
    readonly index: number,
    readonly kind: string,
  ) {}

  /** The step's job id; an Error before its workflow is enqueued. */
  get id(): number {
    if (this.#id === undefined) {
      throw new Error(`step ${this.index} (${this.kind}) has no job id yet: enqueue its workflow`);
    }
    return this.#id;
  }

  /** The job id, or undefined before the workflow is enqueued. */
  get enqueuedId(): number | undefined {
    return this.#id;
  }

  /** @internal Workflow.enqueued() sets it. */
  setId(id: number): void {
    this.#id = id;
  }
}

/** What enqueues a workflow: the queue client (queue.ts), or a test's stand-in. */
export interface Enqueuer {
  enqueueMany(jobs: readonly NewJob[]): Promise<number[]>;
}

/** Steps and what each waits for, enqueued in one call; `defaults` apply to every step. */
export class Workflow {
  readonly steps: Step<unknown>[] = [];
  readonly #jobs: NewJob[] = [];

  constructor(readonly defaults: Pick<NewJob, "queue" | "priority" | "maxAttempts"> = {}) {}

  /**
   * Adds a step: a job of `kind` (a Kind, whose payload schema `payload` must fit, or a
   * kind's name) that runs once the steps (and job ids) `options.after` are done.
   */
  step<Payload extends z.ZodType, Result extends z.ZodType>(
    kind: Kind<Payload, Result>,
    payload: z.input<Payload>,
    options?: StepOptions,
  ): Step<z.output<Result>>;
  step(kind: string, payload?: Json, options?: StepOptions): Step<Json>;
  step(
    kind: string | Kind<z.ZodType, z.ZodType>,
    payload: unknown = {},
    { after = [], onDependencyFailure, ...options }: StepOptions = {},
  ): Step<unknown> {
    const name = typeof kind === "string" ? kind : kind.name;
    if (typeof kind !== "string") {
      const parsed = kind.payload.safeParse(payload);
      if (!parsed.success) {
        throw new TypeError(`a step of "${name}" has an invalid payload: ${parsed.error.message}`);
      }
    }
    if (isObject(payload) && Object.hasOwn(payload, DEPENDENCIES_KEY)) {
      throw new Error(
        `the payload of a step of "${name}" has a "${DEPENDENCIES_KEY}" key: the queue sets ` +
          "it (to its dependencies' results), so rename yours",
      );
    }
    const { indexes, ids } = this.#dependencies(name, after);
    this.#jobs.push({
      ...this.defaults,
      ...options,
      kind: name,
      payload: payload as Json,
      ...(ids.length > 0 ? { dependsOn: ids } : {}),
      ...(indexes.length > 0 ? { dependsOnIndex: indexes } : {}),
      ...(onDependencyFailure === "run" ? { onDependencyFailure } : {}),
    });
    const step = new Step<unknown>(this, this.steps.length, name);
    this.steps.push(step);
    return step;
  }

  #dependencies(kind: string, after: readonly (Step<unknown> | number)[]) {
    const indexes: number[] = [];
    const ids: number[] = [];
    for (const dependency of after) {
      if (dependency instanceof Step && dependency.workflow === this) {
        indexes.push(dependency.index);
      } else if (dependency instanceof Step) {
        if (dependency.enqueuedId === undefined) {
          throw new Error(
            `a step of "${kind}" depends on step ${dependency.index} (${dependency.kind}) of ` +
              "another workflow that is not enqueued yet: enqueue that workflow first",
          );
        }
        ids.push(dependency.enqueuedId);
      } else if (Number.isSafeInteger(dependency)) {
        ids.push(dependency);
      } else {
        throw new TypeError(
          `a step of "${kind}" may depend on steps and job ids, not ${dependency}`,
        );
      }
    }
    return { indexes, ids };
  }

  /** The steps as the queue client's enqueueMany() takes them, in order. */
  newJobs(): NewJob[] {
    return [...this.#jobs];
  }

  /** The steps as the JSON array the SQL function enqueue_many() takes. */
  jobs(): Record<string, Json>[] {
    return this.#jobs.map(({ kind, payload, ...options }) => ({
      kind,
      payload: payload ?? {},
      ...newJobArgs(options),
    }));
  }

  /** Enqueues every step in one enqueueMany() call; their job ids, in step order. */
  async enqueue(queue: Enqueuer): Promise<number[]> {
    this.#checkEnqueueable();
    return this.enqueued(await queue.enqueueMany(this.#jobs));
  }

  /** Tells the workflow the ids enqueue_many() returned for jobs(), when you enqueued it. */
  enqueued(ids: readonly number[]): number[] {
    this.#checkEnqueueable();
    if (ids.length !== this.steps.length) {
      throw new Error(`${ids.length} job ids for a workflow of ${this.steps.length} steps`);
    }
    this.steps.forEach((step, n) => step.setId(ids[n]));
    return [...ids];
  }

  #checkEnqueueable(): void {
    if (this.steps.length === 0) {
      throw new Error("the workflow has no steps: add them with step() first");
    }
    if (this.steps[0].enqueuedId !== undefined) {
      throw new Error("the workflow is enqueued already: build a new one to run it again");
    }
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
