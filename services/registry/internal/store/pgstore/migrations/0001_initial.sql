-- The registry's tables (schema "registry"). Names compare bytewise
-- (COLLATE "C"), as bbolt keys do, so pages resume in the same order.

-- protocols: content-addressed, immutable. meta is the Protocol without
-- its content, so listing never reads documents.
CREATE TABLE protocols (
  sha1    bytea PRIMARY KEY,
  sha256  bytea NOT NULL,
  meta    bytea NOT NULL,
  content bytea NOT NULL
);

-- agents: Agent by resource name; etags come from agent_etag_seq.
CREATE SEQUENCE agent_etag_seq;
CREATE TABLE agents (name text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);

-- agent_requests: the result of the first write with each request id
-- (AIP-155), until SweepRequests drops it.
CREATE TABLE agent_requests (
  request_id  text PRIMARY KEY,
  recorded_at timestamptz NOT NULL,
  data        bytea NOT NULL
);
CREATE INDEX agent_requests_by_time ON agent_requests (recorded_at);

-- clients: Client by resource name.
CREATE TABLE clients (name text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);

-- keys: Key (secret cleared) by id, with the SHA-256 of its secret; owner
-- is the client or agent its name is under.
CREATE TABLE keys (
  id    text PRIMARY KEY,
  name  text COLLATE "C" NOT NULL UNIQUE,
  owner text COLLATE "C" NOT NULL,
  hash  bytea NOT NULL,
  data  bytea NOT NULL
);
CREATE INDEX keys_by_owner ON keys (owner, name);

-- follows: follower follows agent; indexed both ways.
CREATE TABLE follows (
  follower text COLLATE "C" NOT NULL,
  agent    text COLLATE "C" NOT NULL,
  PRIMARY KEY (follower, agent)
);
CREATE INDEX follows_by_agent ON follows (agent, follower);

-- client_group_members: agents in their client's group.
CREATE TABLE client_group_members (agent text COLLATE "C" PRIMARY KEY);

-- groups: Group by path (client/name/...); descendants share the prefix.
CREATE TABLE groups (path text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);

-- group_members: GroupMember by group and agent; indexed both ways.
CREATE TABLE group_members (
  path  text COLLATE "C" NOT NULL,
  agent text COLLATE "C" NOT NULL,
  data  bytea NOT NULL,
  PRIMARY KEY (path, agent)
);
CREATE INDEX group_members_by_agent ON group_members (agent, path);

-- group_join_requests: pending GroupJoinRequest by group and agent.
CREATE TABLE group_join_requests (
  path  text COLLATE "C" NOT NULL,
  agent text COLLATE "C" NOT NULL,
  data  bytea NOT NULL,
  PRIMARY KEY (path, agent)
);
CREATE INDEX group_join_requests_by_agent ON group_join_requests (agent);

-- group_invites: pending GroupInvite by agent and group.
CREATE TABLE group_invites (
  agent text COLLATE "C" NOT NULL,
  path  text COLLATE "C" NOT NULL,
  data  bytea NOT NULL,
  PRIMARY KEY (agent, path)
);

-- notification_outbox: Notification by sequence. outbox_seq's one row
-- hands out sequences inside the writing transaction, so they commit in
-- order and without gaps (a reader resuming after n misses nothing).
CREATE TABLE notification_outbox (seq bigint PRIMARY KEY, data bytea NOT NULL);
CREATE TABLE outbox_seq (id integer PRIMARY KEY, n bigint NOT NULL);
INSERT INTO outbox_seq VALUES (1, 0);
