-- The payment side (issue 14): the ledger provider's payments, the owners'
-- daily spending, and the terms of the offers pairs are answering.

-- payments: store.Payment as JSON by id.
CREATE TABLE payments (
  id   text COLLATE "C" PRIMARY KEY,
  data bytea NOT NULL
);

-- spend_orders: each acceptance counted against its consumer's UTC day,
-- once per order; a day's total is the sum of its rows.
CREATE TABLE spend_orders (
  agent         text COLLATE "C" NOT NULL,
  order_id      text COLLATE "C" NOT NULL,
  day           text COLLATE "C" NOT NULL,
  amount_micros bigint NOT NULL,
  PRIMARY KEY (agent, order_id)
);
CREATE INDEX spend_orders_by_day ON spend_orders (agent, day);

-- offer_terms: the terms of a pair's last offer, JSON.
CREATE TABLE offer_terms (
  dialogue text COLLATE "C" NOT NULL,
  supplier text COLLATE "C" NOT NULL,
  terms    bytea NOT NULL,
  PRIMARY KEY (dialogue, supplier)
);
