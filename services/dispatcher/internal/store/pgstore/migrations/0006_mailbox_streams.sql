-- mailbox_streams: each agent's newest receive stream, across replicas
-- (one stream per agent, the newest wins). Every stream takes an epoch
-- from mailbox_stream_epochs, so streams opened at once on two replicas
-- still have one order; a replica ends its stream of an agent when it
-- hears of a greater epoch (NOTIFY), or reads one here after missing
-- notifications.
CREATE SEQUENCE mailbox_stream_epochs;
CREATE TABLE mailbox_streams (
  agent text COLLATE "C" PRIMARY KEY,
  epoch bigint NOT NULL
);
