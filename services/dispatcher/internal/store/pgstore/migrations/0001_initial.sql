-- The dispatcher's core tables (schema "dispatcher"): routines, tools,
-- conversations, send counts. Names compare bytewise (COLLATE "C").
-- The network stores (dialogues, mailboxes, timers, orders) have no
-- PostgreSQL tables yet; each adds its own migration file when it does.

-- routines: the current Routine by name; routine_versions: every source.
CREATE TABLE routines (name text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);
CREATE TABLE routine_versions (
  name    text COLLATE "C" NOT NULL,
  version bigint NOT NULL,
  source  text NOT NULL,
  PRIMARY KEY (name, version)
);

-- tools: Tool by name.
CREATE TABLE tools (name text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);

-- conversations: store.Conversation as JSON by id, with the peer and the
-- expiry (Unix nanoseconds) that the per-peer cap and the sweep read.
CREATE TABLE conversations (
  id        text PRIMARY KEY,
  peer      text NOT NULL,
  expire_ns bigint NOT NULL,
  data      bytea NOT NULL
);
CREATE INDEX conversations_by_peer ON conversations (peer, expire_ns);
CREATE INDEX conversations_by_expiry ON conversations (expire_ns);

-- send_counts: conversations an agent started per (task, target).
CREATE TABLE send_counts (
  agent         text COLLATE "C" NOT NULL,
  task          text COLLATE "C" NOT NULL,
  target        text COLLATE "C" NOT NULL,
  conversations bigint NOT NULL,
  with_protocol bigint NOT NULL,
  PRIMARY KEY (agent, task, target)
);
