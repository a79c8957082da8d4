-- offer_terms: the terms each offer (or payment_error) of a pair stated,
-- keyed by its message id, so that an offer refused after its terms were
-- recorded removes exactly its own; seq is the order they were recorded
-- in (OfferTerms falls back to the pair's last). A row written before has
-- the message id '' (the pair's last terms then).
ALTER TABLE offer_terms ADD COLUMN message_id text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE offer_terms ADD COLUMN seq bigserial;
ALTER TABLE offer_terms DROP CONSTRAINT offer_terms_pkey;
ALTER TABLE offer_terms ADD PRIMARY KEY (dialogue, supplier, message_id);
