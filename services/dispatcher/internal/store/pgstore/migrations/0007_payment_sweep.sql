-- The payments' retention: payments.sweep_ns is the payment's update time
-- (Unix ns) unless it is reserved (an order holds it), else NULL, so that
-- the sweep removes the payments last changed before its time through the
-- partial index. Rows written before have their time from the JSON, to the
-- microsecond (and no earlier than 1684).
ALTER TABLE payments ADD COLUMN sweep_ns bigint;
UPDATE payments SET sweep_ns = CASE
  WHEN convert_from(data, 'UTF8')::jsonb->>'state' = 'reserved' THEN NULL
  ELSE (GREATEST(extract(epoch FROM (convert_from(data, 'UTF8')::jsonb->>'updateTime')::timestamptz), -9000000000) * 1000000)::bigint * 1000
END;
CREATE INDEX payments_sweep ON payments (sweep_ns) WHERE sweep_ns IS NOT NULL;
