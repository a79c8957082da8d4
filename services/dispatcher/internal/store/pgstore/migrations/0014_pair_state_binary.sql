-- Pair states (dialogue_pairs.state) are now written in protocolcontrol's
-- binary form (first byte 1); those written before are JSON (first byte
-- '{') and are read as they are, so no row changes. A release before this
-- one decodes only JSON: this version number is what makes it refuse the
-- schema (pgdb refuses one migrated past what it knows) instead of
-- starting and failing every reply and deadline of a pair written since.
-- Replicas of that release still running during a rolling update cannot
-- read the new states either: stop them before starting this release.
COMMENT ON COLUMN dialogue_pairs.state IS
  'protocolcontrol''s pair state: the binary form (first byte 1), or JSON (first byte {) when written before migration 0014';
