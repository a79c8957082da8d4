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
CREATE FUNCTION dialogues_sweep_at() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d jsonb := convert_from(NEW.data, 'UTF8')::jsonb;
BEGIN
  NEW.sweep_at := CASE
    WHEN d->>'category' = 'subscription' THEN (d->>'createTime')::timestamptz
    WHEN coalesce((d->>'closed')::boolean, false) THEN coalesce(d->>'closeTime', d->>'createTime')::timestamptz
  END;
  RETURN NEW;
END $$;
CREATE FUNCTION dialogue_messages_dialogue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.dialogue := convert_from(NEW.data, 'UTF8')::jsonb->>'dialogueId';
  RETURN NEW;
END $$;

ALTER TABLE dialogues ADD COLUMN sweep_at timestamptz;
CREATE TRIGGER dialogues_sweep_at BEFORE INSERT OR UPDATE OF data ON dialogues
  FOR EACH ROW EXECUTE FUNCTION dialogues_sweep_at();
UPDATE dialogues SET data = data;
CREATE INDEX dialogues_by_sweep_at ON dialogues (sweep_at, id) WHERE sweep_at IS NOT NULL;

ALTER TABLE dialogue_messages ADD COLUMN dialogue text COLLATE "C";
CREATE TRIGGER dialogue_messages_dialogue BEFORE INSERT OR UPDATE OF data ON dialogue_messages
  FOR EACH ROW EXECUTE FUNCTION dialogue_messages_dialogue();
UPDATE dialogue_messages SET data = data;
ALTER TABLE dialogue_messages ALTER COLUMN dialogue SET NOT NULL;
CREATE INDEX dialogue_messages_by_dialogue ON dialogue_messages (dialogue);
