-- The index of the spend sweep (SweepSpends): it deletes the spend_orders
-- of the oldest days first, LIMIT n, which spend_orders_by_day (agent,
-- day) cannot order without reading every agent's rows.
CREATE INDEX spend_orders_by_sweep ON spend_orders (day);
