# Compiler warnings on every kvtier target, and the header check.
#
# kvtier_apply_warnings(DIR) walks DIR and its subdirectories and gives every C/C++ target defined
# there -Wall -Wextra (and -Werror with KVTIER_WERROR=ON, as CI builds). Generated code (kvtier_proto)
# is left alone. -Wmissing-field-initializers is off: options are built with designated initializers
# that name only the fields they change (HOUSE_STYLE §5), which that warning flags by design. Call it
# once, after every add_subdirectory(), so that a new target gets the same warnings without anyone
# remembering to ask for them.
option(KVTIER_WERROR "Treat compiler warnings as errors (CI builds with ON)" OFF)

set(KVTIER_NO_WARNINGS_TARGETS kvtier_proto)

function(kvtier_apply_warnings dir)
  get_property(_targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS _targets)
    get_target_property(_type ${t} TYPE)
    if(_type STREQUAL "INTERFACE_LIBRARY" OR _type STREQUAL "UTILITY" OR t IN_LIST KVTIER_NO_WARNINGS_TARGETS)
      continue()
    endif()
    target_compile_options(${t} PRIVATE
      $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wno-missing-field-initializers>
      $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<BOOL:${KVTIER_WERROR}>>:-Werror>)
  endforeach()
  get_property(_subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(d IN LISTS _subdirs)
    kvtier_apply_warnings("${d}")
  endforeach()
endfunction()

# kvtier_header_check(TARGET HEADER_DIR... LIBS lib...): one translation unit per public header under
# each HEADER_DIR that includes only that header, compiled into object library TARGET against LIBS, so
# that a header that does not compile on its own (a missing include) fails the build.
function(kvtier_header_check target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "DIRS;LIBS;EXCLUDE")
  set(_srcs)
  foreach(dir IN LISTS arg_DIRS)
    file(GLOB_RECURSE _headers RELATIVE "${dir}" CONFIGURE_DEPENDS "${dir}/*.h")
    foreach(h IN LISTS _headers)
      if(h IN_LIST arg_EXCLUDE)
        continue()
      endif()
      string(MAKE_C_IDENTIFIER "${h}" _id)
      set(_src "${CMAKE_CURRENT_BINARY_DIR}/header_check/${_id}.cc")
      file(CONFIGURE OUTPUT "${_src}" CONTENT "#include \"${h}\"  // must compile on its own\n")
      list(APPEND _srcs "${_src}")
    endforeach()
  endforeach()
  add_library(${target} OBJECT ${_srcs})
  target_link_libraries(${target} PRIVATE ${arg_LIBS})
endfunction()
