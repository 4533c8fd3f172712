-- A member holds at most three open loans.
CREATE FUNCTION loan_limit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM loan WHERE member_id = NEW.member_id AND NOT returned) >= 3 THEN
        RAISE EXCEPTION 'member % already holds three books', NEW.member_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER loan_limit BEFORE INSERT ON loan FOR EACH ROW EXECUTE FUNCTION loan_limit();
