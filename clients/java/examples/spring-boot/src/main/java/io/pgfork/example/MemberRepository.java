package io.pgfork.example;

import java.util.Optional;
import org.springframework.data.jpa.repository.JpaRepository;

/** Members. */
public interface MemberRepository extends JpaRepository<Member, Long> {
    /**
     * @param email an email address
     * @return the member with it
     */
    Optional<Member> findByEmail(String email);
}
