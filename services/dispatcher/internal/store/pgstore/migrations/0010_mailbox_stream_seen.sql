-- mailbox_streams rows are deleted when their stream ends (CloseStream,
-- guarded by epoch so that a newer stream's row stays). A replica that
-- dies cannot, so each replica stamps seen_at on its live streams' rows
-- every minute (TouchStreams), and the dispatcher's sweep deletes rows
-- nobody stamped for a while (SweepStreams), by this index.
ALTER TABLE mailbox_streams ADD COLUMN seen_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX mailbox_streams_seen_at ON mailbox_streams (seen_at);
