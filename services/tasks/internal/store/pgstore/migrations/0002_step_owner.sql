-- owner: the replica (a pgstore.Store's random id) that runs a pending
-- step; it holds the lock pgdb.Exclusive names "tasks.owner.<owner>" while
-- it lives. '' for steps created before replicas had owners.
ALTER TABLE steps ADD COLUMN owner text NOT NULL DEFAULT '';
