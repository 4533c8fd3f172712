DELETE FROM accounts WHERE owner = 'bob';
