-- notification_retries: the network notifications the relay waits to
-- retry (a full mailbox refused them, or their append failed), keyed by
-- their sequence in the registry's outbox, with their schedule: the first
-- failure (RetryFor counts from it), the next attempt and the backoff
-- after it, in Unix ns. Until this table they waited in the outbox, whose
-- trim the relay held back; they now wait here and the outbox is trimmed.
CREATE TABLE notification_retries (
  sequence bigint PRIMARY KEY,
  notification bytea NOT NULL,
  first_ns bigint NOT NULL,
  next_ns bigint NOT NULL,
  backoff_ns bigint NOT NULL
);
