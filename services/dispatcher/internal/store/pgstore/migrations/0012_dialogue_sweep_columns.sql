-- Columns for the dialogue sweep (SweepDialogues), which read them from
-- the JSON before, a scan of dialogues and of dialogue_messages per sweep:
--   dialogues.sweep_at: when the dialogue's retention starts, as on bbolt
--   (closedKey): a broadcast (subscription) from its creation, a closed
--   dialogue from its close (its creation if closed before close times
--   were kept); NULL while it stays. A partial index orders the sweep.
--   dialogue_messages.dialogue: the message's dialogue, indexed.
-- A trigger fills both from the JSON on every insert and update, so that
-- every writer keeps them right, a replica still running the previous
-- binary during a rolling update included.
--
-- In parts (platform/pgdb): the columns and triggers first, committed, so
-- that every row written from then on is filled; then the rows already
-- there, 1000 per transaction by id, so that no transaction holds the
-- row locks and WAL of a whole table; then NOT NULL, proven by a CHECK
-- validated in a transaction of its own (which lets writers on), so that
-- SET NOT NULL, under the table's exclusive lock, does not scan it again;
-- then the indexes. A failure runs the whole file again: every part can
-- run twice.
CREATE OR REPLACE FUNCTION dialogues_sweep_at() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d jsonb := convert_from(NEW.data, 'UTF8')::jsonb;
BEGIN
  NEW.sweep_at := CASE
    WHEN d->>'category' = 'subscription' THEN (d->>'createTime')::timestamptz
    WHEN coalesce((d->>'closed')::boolean, false) THEN coalesce(d->>'closeTime', d->>'createTime')::timestamptz
  END;
  RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION dialogue_messages_dialogue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.dialogue := convert_from(NEW.data, 'UTF8')::jsonb->>'dialogueId';
  RETURN NEW;
END $$;

ALTER TABLE dialogues ADD COLUMN IF NOT EXISTS sweep_at timestamptz;
DROP TRIGGER IF EXISTS dialogues_sweep_at ON dialogues;
CREATE TRIGGER dialogues_sweep_at BEFORE INSERT OR UPDATE OF data ON dialogues
  FOR EACH ROW EXECUTE FUNCTION dialogues_sweep_at();
ALTER TABLE dialogue_messages ADD COLUMN IF NOT EXISTS dialogue text COLLATE "C";
DROP TRIGGER IF EXISTS dialogue_messages_dialogue ON dialogue_messages;
CREATE TRIGGER dialogue_messages_dialogue BEFORE INSERT OR UPDATE OF data ON dialogue_messages
  FOR EACH ROW EXECUTE FUNCTION dialogue_messages_dialogue();

-- pgdb:batch
WITH b AS (SELECT id FROM dialogues WHERE id > coalesce($1::text, '') ORDER BY id LIMIT 1000),
u AS (UPDATE dialogues AS d SET data = d.data FROM b WHERE d.id = b.id)
SELECT max(id) FROM b
-- pgdb:batch
WITH b AS (SELECT id FROM dialogue_messages WHERE id > coalesce($1::text, '') ORDER BY id LIMIT 1000),
u AS (UPDATE dialogue_messages AS m SET data = m.data FROM b WHERE m.id = b.id)
SELECT max(id) FROM b
-- pgdb:commit
ALTER TABLE dialogue_messages DROP CONSTRAINT IF EXISTS dialogue_messages_dialogue_filled;
ALTER TABLE dialogue_messages ADD CONSTRAINT dialogue_messages_dialogue_filled CHECK (dialogue IS NOT NULL) NOT VALID;
-- pgdb:commit
ALTER TABLE dialogue_messages VALIDATE CONSTRAINT dialogue_messages_dialogue_filled;
-- pgdb:commit
ALTER TABLE dialogue_messages ALTER COLUMN dialogue SET NOT NULL;
ALTER TABLE dialogue_messages DROP CONSTRAINT dialogue_messages_dialogue_filled;
CREATE INDEX IF NOT EXISTS dialogues_by_sweep_at ON dialogues (sweep_at, id) WHERE sweep_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS dialogue_messages_by_dialogue ON dialogue_messages (dialogue);
