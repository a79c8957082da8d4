-- The Payments API's request ids (AIP-155) and its limit on each payer's
-- open payments.

-- payments.payer and payments.open mirror the JSON's payer and whether its
-- state is not captured, so that a create counts the payer's open payments
-- through the partial index.
ALTER TABLE payments ADD COLUMN payer text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE payments ADD COLUMN open boolean NOT NULL DEFAULT true;
UPDATE payments SET
  payer = convert_from(data, 'UTF8')::jsonb->>'payer',
  open = convert_from(data, 'UTF8')::jsonb->>'state' <> 'captured';
CREATE INDEX payments_open_by_payer ON payments (payer) WHERE open;

-- payment_requests: the payment each payer's request id created, and when
-- (Unix ns), until the sweep forgets it.
CREATE TABLE payment_requests (
  payer       text COLLATE "C" NOT NULL,
  request_id  text COLLATE "C" NOT NULL,
  payment_id  text COLLATE "C" NOT NULL,
  recorded_ns bigint NOT NULL,
  PRIMARY KEY (payer, request_id)
);
CREATE INDEX payment_requests_by_time ON payment_requests (recorded_ns);
