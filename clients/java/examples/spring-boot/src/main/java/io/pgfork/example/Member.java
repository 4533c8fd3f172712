package io.pgfork.example;

import jakarta.persistence.Entity;
import jakarta.persistence.GeneratedValue;
import jakarta.persistence.GenerationType;
import jakarta.persistence.Id;

/** Someone who borrows books. */
@Entity
public class Member {
    @Id
    @GeneratedValue(strategy = GenerationType.IDENTITY)
    private Long id;
    private String email;
    private String name;

    protected Member() {
    }

    /**
     * A new member.
     *
     * @param email their email address
     * @param name their name
     */
    public Member(String email, String name) {
        this.email = email;
        this.name = name;
    }

    /** @return the id */
    public Long getId() {
        return id;
    }

    /** @return the email address */
    public String getEmail() {
        return email;
    }

    /** @return the name */
    public String getName() {
        return name;
    }
}
