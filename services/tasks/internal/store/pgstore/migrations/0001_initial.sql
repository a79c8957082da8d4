-- The tasks service's tables (schema "tasks"). Ids compare bytewise
-- (COLLATE "C"), as bbolt keys do.

-- tasks: one row per task. seq (from task_seq) orders an agent's tasks by
-- creation.
CREATE SEQUENCE task_seq;
CREATE TABLE tasks (
  id    text COLLATE "C" PRIMARY KEY,
  agent text NOT NULL,
  seq   bigint NOT NULL,
  data  bytea NOT NULL
);
CREATE INDEX tasks_by_agent ON tasks (agent, seq);

-- steps: a task's steps in step id order (ids are time-ordered). pending
-- marks the steps whose status is CREATED: the work list reloaded on start.
CREATE TABLE steps (
  task_id text COLLATE "C" NOT NULL REFERENCES tasks (id),
  step_id text COLLATE "C" NOT NULL,
  pending boolean NOT NULL,
  data    bytea NOT NULL,
  PRIMARY KEY (task_id, step_id)
);
CREATE INDEX steps_pending ON steps (task_id, step_id) WHERE pending;

-- artifacts: a task's artifacts; seq is the position in the task's list
-- (the task's artifact_count when it was added).
CREATE TABLE artifacts (
  task_id     text COLLATE "C" NOT NULL REFERENCES tasks (id),
  seq         bigint NOT NULL,
  artifact_id text COLLATE "C" NOT NULL,
  data        bytea NOT NULL,
  PRIMARY KEY (task_id, seq),
  UNIQUE (task_id, artifact_id)
);

-- artifact_chunks: artifact bytes, in chunks of at most 256 KiB numbered
-- from 0, written before the artifact's metadata (as files are).
CREATE TABLE artifact_chunks (
  task_id     text COLLATE "C" NOT NULL,
  artifact_id text COLLATE "C" NOT NULL,
  n           integer NOT NULL,
  data        bytea NOT NULL,
  PRIMARY KEY (task_id, artifact_id, n)
);
