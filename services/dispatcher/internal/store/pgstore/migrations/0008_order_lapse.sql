-- orders.lapse_ns: while an order is active, when its pair's first pending
-- deadline passes (Unix ns; store.Order.LapseAt), from which instant it
-- stands failed (store.Order.At), so that ListOrders filters by the state
-- at the time of the read; NULL otherwise. Orders written before have none.
ALTER TABLE orders ADD COLUMN lapse_ns bigint;
