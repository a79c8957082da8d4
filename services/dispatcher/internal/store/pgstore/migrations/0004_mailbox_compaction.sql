-- compact_ns: the send time (Unix ns) of the mailbox's oldest kept
-- reference when that reference is acknowledged, else NULL. Compaction
-- reads the mailboxes due through the partial index, oldest first, so a
-- pass costs what it removes, not the number of mailboxes or references.
-- An acknowledgement sets it; compaction moves it to the next oldest
-- reference.
ALTER TABLE mailboxes ADD COLUMN compact_ns bigint;
CREATE INDEX mailboxes_compact_ns ON mailboxes (compact_ns) WHERE compact_ns IS NOT NULL;
UPDATE mailboxes b SET compact_ns = (
  SELECT CASE WHEN r.cursor <= b.acked THEN r.sent_ns END
  FROM mailbox_refs r WHERE r.agent = b.agent ORDER BY r.cursor LIMIT 1);
