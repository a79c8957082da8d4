-- The network stores: mailboxes, dialogues, timers, orders. Names and ids
-- compare bytewise (COLLATE "C"), so pages and scans order as in bbolt.

-- mail_messages: a mailbox.Message as JSON, stored once however many
-- mailboxes hold it; refs counts the mailbox_refs rows naming it.
CREATE TABLE mail_messages (
  id   text COLLATE "C" PRIMARY KEY,
  refs bigint NOT NULL,
  data bytea NOT NULL
);
-- mailboxes: one agent's position (mailbox.State).
CREATE TABLE mailboxes (
  agent         text COLLATE "C" PRIMARY KEY,
  head          bigint NOT NULL DEFAULT 0,
  acked         bigint NOT NULL DEFAULT 0,
  pending       bigint NOT NULL DEFAULT 0,
  pending_bytes bigint NOT NULL DEFAULT 0
);
-- mailbox_refs: the message at one cursor of an agent's mailbox, with its
-- send time (Unix ns, for compaction) and body size (for the bound).
CREATE TABLE mailbox_refs (
  agent   text COLLATE "C" NOT NULL,
  cursor  bigint NOT NULL,
  message text COLLATE "C" NOT NULL,
  sent_ns bigint NOT NULL,
  size    bigint NOT NULL,
  PRIMARY KEY (agent, cursor)
);

-- dialogues: store.Dialogue as JSON by id.
CREATE TABLE dialogues (id text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);
-- dialogue_messages: store.DialogueMessage as JSON by id.
CREATE TABLE dialogue_messages (id text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);
-- dialogue_receipts: agent received message.
CREATE TABLE dialogue_receipts (
  message text COLLATE "C" NOT NULL,
  agent   text COLLATE "C" NOT NULL,
  PRIMARY KEY (message, agent)
);
-- dialogue_participants: store.Participant as JSON; indexed by agent too
-- (closing all of an agent's dialogues).
CREATE TABLE dialogue_participants (
  dialogue text COLLATE "C" NOT NULL,
  agent    text COLLATE "C" NOT NULL,
  data     bytea NOT NULL,
  PRIMARY KEY (dialogue, agent)
);
CREATE INDEX dialogue_participants_by_agent ON dialogue_participants (agent, dialogue);
-- dialogue_pairs: a pair's protocol state (opaque JSON), agents a < b.
CREATE TABLE dialogue_pairs (
  dialogue text COLLATE "C" NOT NULL,
  a        text COLLATE "C" NOT NULL,
  b        text COLLATE "C" NOT NULL,
  state    bytea NOT NULL,
  PRIMARY KEY (dialogue, a, b)
);
-- dialogue_requests: store.Request as JSON, with its start (Unix ns) for
-- the sweep.
CREATE TABLE dialogue_requests (
  sender   text COLLATE "C" NOT NULL,
  id       text COLLATE "C" NOT NULL,
  start_ns bigint NOT NULL,
  data     bytea NOT NULL,
  PRIMARY KEY (sender, id)
);
CREATE INDEX dialogue_requests_by_start ON dialogue_requests (start_ns);

-- timers: store.Timer as JSON by identity, due at at_ns (Unix ns).
CREATE TABLE timers (
  dialogue    text COLLATE "C" NOT NULL,
  counterpart text COLLATE "C" NOT NULL,
  name        text COLLATE "C" NOT NULL,
  at_ns       bigint NOT NULL,
  data        bytea NOT NULL,
  PRIMARY KEY (dialogue, counterpart, name)
);
CREATE INDEX timers_by_time ON timers (at_ns, dialogue, counterpart, name);

-- orders: store.Order as JSON (its trail included), one per pair (a < b);
-- never deleted. agent_orders indexes both parties.
CREATE TABLE orders (
  id       text COLLATE "C" PRIMARY KEY,
  dialogue text COLLATE "C" NOT NULL,
  a        text COLLATE "C" NOT NULL,
  b        text COLLATE "C" NOT NULL,
  state    text NOT NULL,
  data     bytea NOT NULL,
  UNIQUE (dialogue, a, b)
);
CREATE TABLE agent_orders (
  agent    text COLLATE "C" NOT NULL,
  order_id text COLLATE "C" NOT NULL,
  PRIMARY KEY (agent, order_id)
);
